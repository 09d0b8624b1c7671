//! Keras's `TerminateOnNaN`, the binary end to end: a run whose loss overflows stops with
//! exit code 1 and a message naming the step and what is not finite; it writes no final
//! weights and no summary as if it had succeeded, `run.json` says `failed`, and the backups
//! it leaves hold only finite weights.

mod common;

use common::{assert_exit, json, tempdir, text};

#[test]
fn a_loss_that_overflows_stops_training_and_keeps_the_last_good_backup() {
    let dir = tempdir();
    let d = dir.path();
    // Mean squared error on logits with a huge rate overflows within a few steps.
    let out = common::run_diverging(d, &["--set", "callbacks=[{ kind = \"backup_and_restore\", save_freq = 1 }]"]);
    assert_exit(&out, 1);
    let stderr = text(&out).1;
    assert!(stderr.contains("training diverged at step "), "{stderr}");
    assert!(stderr.contains("is not finite (NaN or infinite)"), "{stderr}");
    assert!(stderr.contains("the last good backup stays"), "{stderr}");
    assert!(!d.join("model.safetensors").exists(), "no final weights as if the run had succeeded");
    assert!(!d.join("summary.json").exists(), "no summary as if the run had succeeded");
    let record = json(&d.join("run.json"));
    assert_eq!((record["status"].as_str(), record["exit_code"].as_u64()), (Some("failed"), Some(1)), "{record}");
    let backups: Vec<_> = std::fs::read_dir(d.join("backup")).unwrap().map(|e| e.unwrap().path()).collect();
    assert!(!backups.is_empty(), "the last good backup stays");
    for b in backups {
        for (name, values) in common::weights(&b.join("model.safetensors")) {
            assert!(values.iter().all(|v| v.is_finite()), "{}: `{name}` is not finite", b.display());
        }
    }
}

/// Without backups the message said "it resumes from the last backup" (issue 29): there is
/// none; it says that the next run starts over and how to have one.
#[test]
fn divergence_without_backups_says_the_next_run_starts_over() {
    let dir = tempdir();
    let out = common::run_diverging(dir.path(), &[]);
    assert_exit(&out, 1);
    let stderr = text(&out).1;
    assert!(
        stderr.contains("training diverged at step ") && stderr.contains("there is no backup to go back to"),
        "{stderr}"
    );
    assert!(stderr.contains("the next run starts over from step 0"), "{stderr}");
    assert!(stderr.contains("kind = \"backup_and_restore\""), "{stderr}");
    assert!(!stderr.contains("resumes from the last backup"), "{stderr}");
}
