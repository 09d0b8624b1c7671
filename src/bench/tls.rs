//! `trainrun bench --only tls`: what mutual TLS costs on the two-worker tutorial job over the
//! TCP ring (`mnist_multiworker.toml` with `transport = "tcp"`), plain and TLS alternately in
//! one sitting, with a CA and certificate made for the sitting; each pair's ratio of steady
//! examples/s, and their median against the target of at most 10 %.

use super::{f, job, median};
use std::path::Path;

const SPEC: &str = "specs/mnist_multiworker.toml";

/// `pairs` alternating pairs, plain first.
pub(super) fn run(exe: &Path, pairs: usize) -> Result<(), String> {
    let dir = tempfile::tempdir().map_err(|e| format!("no temporary folder: {e}"))?;
    let names = ["localhost".to_string(), "127.0.0.1".to_string()];
    let files = crate::cluster::certs::write(dir.path(), "bench", &names, 1).map_err(|e| e.to_string())?;
    let tls = format!("cluster.tls={}", files.inline_table());
    let tcp = "strategy.communication.transport=\"tcp\"";
    println!("\n== TLS ÷ plain TCP, steady examples/s of the two-worker tutorial job on the TCP ring, alternating");
    println!("{:>6} {:>12} {:>12} {:>8}", "pair", "plain ex/s", "TLS ex/s", "ratio");
    let mut ratios = Vec::new();
    for pair in 1..=pairs {
        let plain = job(exe, SPEC, &[tcp])?.summary;
        let sealed = job(exe, SPEC, &[tcp, &tls])?.summary;
        for (s, want) in [(&plain, "tcp"), (&sealed, "tcp_tls")] {
            if s["transport"] != want {
                return Err(format!("a run meant to go over {want} went over {}", s["transport"]));
            }
        }
        let (plain, sealed) = (f(&plain, "steady_examples_per_s"), f(&sealed, "steady_examples_per_s"));
        let ratio = sealed / plain.max(1.0);
        ratios.push(ratio);
        println!("{pair:>6} {plain:>12.0} {sealed:>12.0} {ratio:>8.3}");
    }
    println!("TLS median ratio {:.3} (target ≥ 0.90: TLS costs at most 10 %)", median(ratios));
    Ok(())
}
