//! Retention (docs/FTL-MODEL.md, "Retention"): old pages read slower by the configured
//! factor; a host write, reseq's engine rewrite and a GC move make them fresh again; the
//! age clock and the page write times survive a state file, and an old state file loads.

use crate::commands::simulate::engine_rewrite;
use crate::sim::ftl::{Ftl, Params, SLOT, seq_read_time};
use crate::sim::{SimDevice, SimState};

const MIB: u64 = 1 << 20;
const REGION: u64 = 128 * MIB / SLOT;

fn aging(cap: f64) -> Params {
    Params {
        logical_bytes: 512 * MIB,
        retention_onset_days: 10.0,
        retention_full_days: 20.0,
        retention_max_factor: cap,
        ..Params::preset("consumer-tlc-aging").unwrap()
    }
}

fn read(f: &mut Ftl) -> f64 {
    seq_read_time(f, 0, REGION, MIB, 1)
}

/// The same drive with retention off: what its reads cost with every page fresh.
fn unaged(f: &Ftl) -> f64 {
    let mut g = f.clone();
    g.p.retention_max_factor = 1.0;
    read(&mut g)
}

#[test]
fn old_pages_read_slower_by_the_configured_factor() {
    let cap = 30.0;
    let mut f = Ftl::new(aging(cap));
    f.write_lpns(0..REGION).unwrap();
    let fresh = read(&mut f);
    f.age(10.0).unwrap();
    assert_eq!(read(&mut f), fresh, "no slowdown up to the onset");
    f.age(5.0).unwrap();
    let half = read(&mut f);
    f.age(30.0).unwrap();
    let old = read(&mut f);
    // Every sense operation takes tR x cap: the same as a drive whose tR is that long.
    let mut slow = Ftl::new(Params { t_read_us: aging(cap).t_read_us * cap, retention_max_factor: 1.0, ..aging(cap) });
    slow.write_lpns(0..REGION).unwrap();
    let want = read(&mut slow);
    assert!((old / want - 1.0).abs() < 1e-9, "aged read {old} s, a drive with tR x{cap} {want} s");
    assert!(fresh < half && half < old, "the factor grows with age: {fresh} {half} {old}");
    assert!(old > 3.0 * fresh, "{old} vs fresh {fresh}");
}

#[test]
fn a_host_write_and_reseqs_rewrite_make_old_data_fresh() {
    let mut st = SimState::new(aging(50.0));
    st.ftl.write_lpns(0..2 * REGION).unwrap();
    let fresh = read(&mut st.ftl);
    st.ftl.age(60.0).unwrap();
    assert!(read(&mut st.ftl) > 3.0 * fresh);
    // reseq's engine through the simulated device, over the first region.
    let dev = SimDevice::new(st);
    engine_rewrite(&dev, 0, REGION * SLOT, 4 * MIB, true, true, &mut crate::engine::Everything).unwrap();
    let mut st = dev.into_state();
    assert_eq!(read(&mut st.ftl), unaged(&st.ftl), "rewritten by the engine: no page old");
    assert!(read(&mut st.ftl) <= fresh * 1.001, "{} vs fresh {fresh}", read(&mut st.ftl));
    // The second region is still old; a host write of it makes it fresh.
    let second = |f: &mut Ftl| seq_read_time(f, REGION, REGION, MIB, 1);
    assert!(second(&mut st.ftl) > 3.0 * fresh);
    let SimState { ftl, writer } = &mut st;
    writer.write(ftl, REGION..2 * REGION).unwrap();
    assert!(second(&mut st.ftl) <= fresh * 1.001);
}

#[test]
fn a_gc_move_makes_old_data_fresh() {
    // The smallest size from 512 MiB up this preset's GC never gets stuck on, full.
    let mut f = Ftl::new(Params { logical_bytes: 539 * MIB, ..aging(50.0) });
    let old = |f: &Ftl| -> u64 { f.data_ages().iter().filter(|(d, _)| *d >= 60).map(|(_, b)| b).sum() };
    // The region and another interleaved, so every line holds both, then aged.
    f.write_lpns((0..REGION).flat_map(|i| [i, REGION + i])).unwrap();
    f.age(60.0).unwrap();
    let before = read(&mut f);
    assert!(before > 3.0 * unaged(&f), "old before GC");
    // The rest of the drive filled (fresh), so that GC must move the region to free a
    // line once the other region is overwritten and those lines are half valid.
    f.write_lpns(2 * REGION..f.n_lpn).unwrap();
    assert_eq!((f.stats.gc_slots, old(&f)), (0, 2 * REGION * SLOT));
    for _ in 0..8 {
        f.write_lpns(REGION..2 * REGION).unwrap();
    }
    // Nothing but GC wrote the region since it aged: each of its pages that is not old
    // any more was made fresh by a GC move.
    let left = old(&f);
    assert!(left <= REGION * SLOT / 2, "GC moved most of the region; {left} bytes are still old");
    assert!(f.stats.gc_slots >= REGION - left / SLOT, "GC moved {} slots", f.stats.gc_slots);
    let after = read(&mut f);
    assert!(after < 0.75 * before, "moved by GC, the region reads faster: {after} vs {before}");
}

#[test]
fn the_clock_and_page_ages_survive_a_state_file_and_an_old_one_loads() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("ssd.sim");
    let mut st = SimState::new(aging(20.0));
    st.ftl.write_lpns(0..REGION).unwrap();
    st.ftl.age(12.5).unwrap();
    st.ftl.write_lpns(0..REGION / 2).unwrap();
    st.ftl.age(30.0).unwrap();
    st.save(&path).unwrap();
    let mut back = SimState::load(&path).unwrap();
    assert_eq!(back.ftl.age_days, 42.5);
    assert_eq!(back.ftl.data_ages(), st.ftl.data_ages());
    assert_eq!(read(&mut back.ftl), read(&mut st.ftl));
    assert!(st.ftl.age(crate::sim::ftl::MAX_AGE_DAYS).is_err(), "past a century");

    // The same drive as a version 1 file (no clock, no page times): loads, retention off.
    let v1 = dir.path().join("old.sim");
    let mut old = SimState::new(Params { retention_max_factor: 1.0, ..aging(1.0) });
    old.ftl.write_lpns(0..REGION).unwrap();
    old.save(&v1).unwrap();
    std::fs::write(&v1, as_version_1(&std::fs::read(&v1).unwrap())).unwrap();
    let mut loaded = SimState::load(&v1).unwrap();
    assert_eq!(loaded.ftl.age_days, 0.0);
    assert!(!loaded.ftl.p.retention_on());
    assert_eq!(read(&mut loaded.ftl), read(&mut old.ftl));
}

/// A state file as version 1 wrote it: its magic, a header without the retention
/// fields, the two mapping tables only.
fn as_version_1(v2: &[u8]) -> Vec<u8> {
    let nl = v2.iter().position(|&b| b == b'\n').unwrap() + 1;
    let end = nl + v2[nl..].iter().position(|&b| b == b'\n').unwrap() + 1;
    let mut h: serde_json::Value = serde_json::from_slice(&v2[nl..end]).unwrap();
    let tables = (h["l2p_len"].as_u64().unwrap() + h["p2l_len"].as_u64().unwrap()) as usize * 4;
    let body = &v2[end..end + tables];
    let o = h.as_object_mut().unwrap();
    o.remove("written_len");
    o["tables_blake3"] = blake3::hash(body).to_hex().to_string().into();
    let ftl = o["ftl"].as_object_mut().unwrap();
    ftl.remove("age_days");
    for k in ["retention_onset_days", "retention_full_days", "retention_max_factor"] {
        ftl["p"].as_object_mut().unwrap().remove(k);
    }
    let mut out = b"reseq-sim 1\n".to_vec();
    out.extend(serde_json::to_vec(&h).unwrap());
    out.push(b'\n');
    out.extend_from_slice(body);
    out
}
