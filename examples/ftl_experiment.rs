//! The reference experiment on the Rust FTL model alone, for `bench/sim-experiment.sh`:
//! a 4 GiB file on an 8 GiB consumer-nvme device, 50+200+800+4000 MiB of random 4 KiB
//! writes, one ascending 1 MiB rewrite, six full sequential reads. Prints the read times,
//! the wall time and the model state per 4 KiB of simulated space.

use std::time::Instant;

use reseq::testing::{Ftl, Params, SLOT, Strategy, degrade, rewrite};

fn main() {
    let preset = std::env::args().nth(1).unwrap_or_else(|| "consumer-nvme".into());
    let t = Instant::now();
    let mut f = Ftl::new(Params::preset(&preset).expect("a preset name"));
    let nf = (4u64 << 30) / SLOT;
    let reads = degrade(&mut f, nf, 1, &[50.0, 200.0, 800.0, 4000.0]).expect("a drive that does not get stuck");
    let after = rewrite(&mut f, nf, Strategy::default()).expect("a drive that does not get stuck");
    let wall = t.elapsed().as_secs_f64();
    let per_4k = f.state_bytes() as f64 / (f.n_lpn as f64);
    println!(
        "{preset}: reads {} | after rewrite {:.2} s | wall {wall:.3} s | model state {:.2} bytes per 4 KiB",
        reads.iter().map(|r| format!("{r:.2}")).collect::<Vec<_>>().join(" "),
        after.read_seconds,
        per_4k
    );
}
