//! The Rust FTL model against the Python reference: same inputs, same virtual times
//! within 0.1 %, same GC counts exactly. Fixtures: tests/fixtures/ftl_reference.json,
//! made by tests/fixtures/ftl_reference.py (its docstring has the command).

use crate::sim::experiment::{Order, Strategy, degrade, rewrite};
use crate::sim::ftl::{Ftl, Params, SLOT, seq_read_time};
use serde_json::Value;

fn params(base: &Value, over: &Value) -> Params {
    let mut p = serde_json::to_value(Params::default()).unwrap();
    for src in [base, over] {
        for (k, v) in src.as_object().unwrap() {
            assert!(p.get(k).is_some(), "unknown parameter {k}");
            p[k] = v.clone();
        }
    }
    serde_json::from_value(p).unwrap()
}

fn close(what: &str, got: f64, want: f64) {
    let rel = ((got - want) / want).abs();
    assert!(rel <= 0.001, "{what}: Rust {got} vs reference {want} ({:.4} %)", rel * 100.0);
}

#[test]
fn rust_model_matches_the_python_reference() {
    let fixtures: Vec<Value> = serde_json::from_str(include_str!("../../tests/fixtures/ftl_reference.json")).unwrap();
    assert!(fixtures.len() >= 8);
    for sc in &fixtures {
        let name = sc["name"].as_str().unwrap();
        let p = params(&sc["base"], &sc["params"]);
        let nf = sc["file_mib"].as_u64().unwrap() * (1 << 20) / SLOT;
        let stages: Vec<f64> = sc["stages_mib"].as_array().unwrap().iter().map(|v| v.as_f64().unwrap()).collect();
        let mut f = Ftl::new(p);
        let deg = degrade(&mut f, nf, 1, &stages).unwrap();
        let exp = &sc["expect"];
        for (i, (g, w)) in deg.iter().zip(exp["degrade"].as_array().unwrap()).enumerate() {
            close(&format!("{name}: degrade step {i}"), *g, w.as_f64().unwrap());
        }
        assert_eq!(f.stats.host_slots, exp["host_slots"].as_u64().unwrap(), "{name}: host slots");
        assert_eq!(f.stats.gc_slots, exp["gc_slots"].as_u64().unwrap(), "{name}: GC slots");
        assert_eq!(f.stats.gc_runs, exp["gc_runs"].as_u64().unwrap(), "{name}: GC runs");
        for (r, w) in sc["reads"].as_array().unwrap().iter().zip(exp["reads"].as_array().unwrap()) {
            let (kib, qd) = (r[0].as_u64().unwrap(), r[1].as_u64().unwrap());
            let got = seq_read_time(&mut f, 0, nf, kib * 1024, qd as usize);
            close(&format!("{name}: read {kib} KiB QD{qd}"), got, w.as_f64().unwrap());
        }
        for (r, w) in sc["rewrites"].as_array().unwrap().iter().zip(exp["rewrites"].as_array().unwrap()) {
            let s = Strategy {
                chunk_bytes: r["chunk_kib"].as_u64().unwrap() * 1024,
                writers: r.get("writers").and_then(Value::as_u64).unwrap_or(1),
                order: match r.get("order").and_then(Value::as_str).unwrap_or("asc") {
                    "asc" => Order::Ascending,
                    "desc" => Order::Descending,
                    "desc4k" => Order::Descending4k,
                    o => panic!("order {o}"),
                },
                noise_interval_us: r.get("noise_iv").and_then(Value::as_f64).unwrap_or(0.0),
            };
            let mut copy = f.clone();
            let got = rewrite(&mut copy, nf, s).unwrap();
            let what = format!("{name}: rewrite {r}");
            close(&format!("{what} read"), got.read_seconds, w[0].as_f64().unwrap());
            close(&format!("{what} duration"), got.rewrite_seconds, w[1].as_f64().unwrap());
            assert_eq!(got.noise_writes, w[2].as_u64().unwrap(), "{what}: noise writes");
        }
    }
}
