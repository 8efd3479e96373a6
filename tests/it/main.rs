//! The integration tests, as one binary (`cargo test --features fault-injection`): they
//! need the test-only fault hooks, so Cargo.toml builds this binary only with that feature
//! (`required-features`), and one binary links once instead of once per suite.
//!
//! Suites run side by side (three test threads, set in .cargo/config.toml). The few that
//! must have the machine to themselves (the emulated-SSD suites time the drive's clock;
//! a few load the CPU or break other tests' tools for a while) hold
//! `common::exclusive()`; every other test that runs the binary or makes a device holds
//! `common::shared()`, taken for it by the helpers it calls.

mod common;
#[path = "common/faultfs.rs"]
mod faultfs;

mod aliases;
mod architecture;
mod backing_writers;
mod bench_reports;
mod btrfs;
mod cgroup_strike;
mod cold_data;
mod crash_and_resume;
mod deb;
mod demo;
mod file_mode;
mod foreign_writers;
mod freeze_bound;
mod freeze_deps;
mod generate;
mod hidden_writers;
mod kill_by_name;
mod leftovers;
mod nightly;
mod no_silent_loss;
mod packaging;
mod plan_predicts;
mod postgres;
mod refusals_and_faults;
mod report_schema;
mod rewrite_device;
mod scale;
mod scan;
mod screen;
mod sim_cli;
mod sim_serve;
mod sparse;
mod storage_stacks;
mod trim;
mod used_space;
