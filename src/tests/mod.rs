//! Tests of the library's parts together, without root: the engine's invariants over a
//! simulated SSD with a scripted guard, the simulated SSD against the Python reference,
//! the engine restoring a degraded simulated drive, and the text of saved reports.

mod engine_script;
mod render_snapshots;
mod sim_reference;
mod sim_retention;
mod sim_ssd;
