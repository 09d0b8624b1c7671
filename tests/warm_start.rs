//! `[model] init_from` end to end: a run fine-tunes from weights another run wrote (its run
//! folder, a checkpoint folder, or a bf16 safetensors file another writer made) under one
//! process, mirrored and two workers; strict refuses every mismatch at once, naming both shapes,
//! at `check` and at the run; not strict loads what matches and says what it left; a NaN is
//! refused; a fine-tune stopped and started again resumes its own backup bit-identically.

mod common;

use common::{
    assert_exit, json, run, short_mnist_run, signal, spawn, tempdir, text, wait_for_any_backup, wait_within, weights,
};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use std::time::Duration;

const LIMIT: Duration = Duration::from_secs(120);

/// A short MNIST run whose `model.safetensors` the fine-tunes start from.
fn pretrained() -> &'static Path {
    static RUN: OnceLock<(tempfile::TempDir, PathBuf)> = OnceLock::new();
    let (_, dir) = RUN.get_or_init(|| {
        let tmp = tempdir();
        let dir = tmp.path().join("pre");
        short_mnist_run(&dir, 40);
        (tmp, dir)
    });
    dir
}

fn by_name(path: &Path) -> BTreeMap<String, Vec<f32>> {
    weights(path).into_iter().collect()
}

/// `a` and `b` hold the same values to within 1e-20 (what a step at learning rate 1e-30 moves).
fn same(a: &[f32], b: &[f32]) -> bool {
    a.len() == b.len() && a.iter().zip(b).all(|(x, y)| (x - y).abs() <= 1e-20)
}

/// A fine-tune of one step at learning rate 1e-30, so its final weights are what it loaded
/// (a step moves none by more than 1e-20).
fn frozen(spec: &str, out: &Path, init: &str, extra: &[&str]) -> std::process::Output {
    let mut args = vec![
        spec.to_string(),
        "--set".into(),
        format!("run.out_dir={}", out.display()),
        "--set".into(),
        format!("model.init_from={init}"),
        "--set".into(),
        "train.steps_per_epoch=1".into(),
        "--set".into(),
        "train.epochs=1".into(),
        "--set".into(),
        "optimizer.learning_rate=1e-30".into(),
    ];
    args.extend(extra.iter().map(|s| s.to_string()));
    run(&args.iter().map(String::as_str).collect::<Vec<_>>())
}

#[test]
fn every_strategy_starts_from_the_loaded_weights() {
    let source = by_name(&pretrained().join("model.safetensors"));
    let init = format!("{{ path = \"{}\" }}", pretrained().display());
    for (name, spec, extra) in [
        ("single", "specs/mnist_single.toml", &[][..]),
        ("mirrored", "specs/mnist_single.toml", &["--set", "strategy={ kind = \"mirrored\", devices = 2 }"][..]),
        ("multiworker", "specs/mnist_multiworker.toml", &[]),
    ] {
        let tmp = tempdir();
        let out = frozen(spec, &tmp.path().join("run"), &init, extra);
        assert_exit(&out, 0);
        let stderr = text(&out).1;
        assert!(stderr.contains("warm start from") && stderr.contains("6 tensors"), "{name}: {stderr}");
        let loaded = by_name(&tmp.path().join("run/model.safetensors"));
        assert_eq!(loaded.keys().collect::<Vec<_>>(), source.keys().collect::<Vec<_>>());
        for (t, values) in &source {
            assert!(same(&loaded[t], values), "{name}: {t} did not start from the file's values");
        }
    }
}

#[test]
fn strict_refuses_every_mismatch_at_once_and_not_strict_keeps_what_matches() {
    let tmp = tempdir();
    // The tutorial CNN with a narrower hidden layer: the convolution and the last bias match.
    let spec = tmp.path().join("narrow.toml");
    std::fs::write(
        &spec,
        format!(
            "extends = \"{}\"\n[model]\nlayers = [{{ type = \"reshape\", target_shape = [28, 28, 1] }}, {{ type = \"conv2d\", filters = 32, kernel_size = 3, activation = \"relu\" }}, \
             {{ type = \"flatten\" }}, {{ type = \"dense\", units = 64, activation = \"relu\" }}, {{ type = \"dense\", units = 10 }}]\n",
            std::fs::canonicalize("specs/base/mnist_tutorial.toml").unwrap().display()
        ),
    )
    .unwrap();
    let s = spec.display().to_string();
    let init = |strict: bool| format!("model.init_from={{ path = \"{}\", strict = {strict} }}", pretrained().display());
    let strict = init(true);
    let check = run(&["check", &s, "--set", &strict]);
    assert_exit(&check, 2);
    let (stdout, stderr) = text(&check);
    for line in [
        "`dense/kernel` is [21632, 64] in the model but [21632, 128] in the file",
        "`dense/bias` is [64] in the model but [128] in the file",
        "`dense_1/kernel` is [64, 10] in the model but [128, 10] in the file",
    ] {
        assert!(stdout.contains(line), "check does not list {line}:\n{stdout}");
    }
    assert!(stderr.contains("strict = false"), "{stderr}");

    let out = frozen(&s, &tmp.path().join("strict"), &init(true)["model.init_from=".len()..], &[]);
    assert!(!out.status.success());
    let stderr = text(&out).1;
    assert!(stderr.contains("3 tensors do not match") && stderr.contains("[21632, 64] in the model"), "{stderr}");

    let out = frozen(&s, &tmp.path().join("loose"), &init(false)["model.init_from=".len()..], &[]);
    assert_exit(&out, 0);
    assert!(text(&out).1.contains("left: `dense/kernel`"), "{}", text(&out).1);
    let (loaded, source) =
        (by_name(&tmp.path().join("loose/model.safetensors")), by_name(&pretrained().join("model.safetensors")));
    for name in ["conv2d/kernel", "conv2d/bias", "dense_1/bias"] {
        assert!(same(&loaded[name], &source[name]), "{name} was not loaded");
    }
    assert_ne!(loaded["dense/bias"].len(), source["dense/bias"].len());
}

#[test]
fn half_precision_files_from_another_writer_load_and_a_nan_is_refused() {
    let tmp = tempdir();
    let source = by_name(&pretrained().join("model.safetensors"));
    // The same weights as bf16, written by the safetensors crate itself.
    let as_bf16: BTreeMap<String, (Vec<u8>, Vec<usize>)> = {
        let bytes = std::fs::read(pretrained().join("model.safetensors")).unwrap();
        let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
        st.tensors()
            .into_iter()
            .map(|(name, view)| {
                let data = view
                    .data()
                    .chunks_exact(4)
                    .flat_map(|b| half::bf16::from_f32(f32::from_le_bytes([b[0], b[1], b[2], b[3]])).to_le_bytes())
                    .collect();
                (name, (data, view.shape().to_vec()))
            })
            .collect()
    };
    let write = |path: &Path, poison: bool| {
        let views: Vec<(String, safetensors::tensor::TensorView<'_>)> = as_bf16
            .iter()
            .map(|(n, (d, s))| {
                (n.clone(), safetensors::tensor::TensorView::new(safetensors::Dtype::BF16, s.clone(), d).unwrap())
            })
            .collect();
        let mut bytes = safetensors::serialize(views, None).unwrap();
        if poison {
            let header = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
            bytes[8 + header..10 + header].copy_from_slice(&half::bf16::NAN.to_le_bytes());
        }
        std::fs::write(path, bytes).unwrap();
    };
    let file = tmp.path().join("bf16.safetensors");
    write(&file, false);
    let out = frozen(
        "specs/mnist_single.toml",
        &tmp.path().join("run"),
        &format!("{{ path = \"{}\" }}", file.display()),
        &[],
    );
    assert_exit(&out, 0);
    let loaded = by_name(&tmp.path().join("run/model.safetensors"));
    for (name, values) in &source {
        let want: Vec<f32> = values.iter().map(|v| half::bf16::from_f32(*v).to_f32()).collect();
        assert!(same(&loaded[name], &want), "{name} is not the bf16 file's values");
    }

    let poisoned = tmp.path().join("nan.safetensors");
    write(&poisoned, true);
    let out = frozen(
        "specs/mnist_single.toml",
        &tmp.path().join("nan"),
        &format!("{{ path = \"{}\" }}", poisoned.display()),
        &[],
    );
    assert!(!out.status.success());
    let stderr = text(&out).1;
    assert!(stderr.contains("holds NaN") && stderr.contains("tensor `"), "{stderr}");
}

#[test]
fn a_stopped_fine_tune_resumes_its_own_backup_bit_identically() {
    let init = format!("model.init_from={{ path = \"{}\" }}", pretrained().display());
    let args = |dir: &Path| -> Vec<String> {
        [
            "specs/mnist_single.toml",
            "-q",
            "--set",
            &format!("run.out_dir={}", dir.display()),
            "--set",
            &init,
            "--set",
            "train.epochs=2",
            "--set",
            "train.steps_per_epoch=80",
            "--set",
            "optimizer.momentum=0.9",
            "--set",
            "callbacks=[{ kind = \"backup_and_restore\", save_freq = 7 }]",
        ]
        .map(String::from)
        .to_vec()
    };
    let reference = tempdir();
    let r = args(reference.path());
    assert_exit(&run(&r.iter().map(String::as_str).collect::<Vec<_>>()), 0);

    let tmp = tempdir();
    let a = args(tmp.path());
    let a: Vec<&str> = a.iter().map(String::as_str).collect();
    let mut child = spawn(&a);
    wait_for_any_backup(&tmp.path().join("backup"), LIMIT, &mut child);
    signal(child.id(), libc::SIGTERM);
    let (stopped, _) = wait_within(child, LIMIT);
    assert_exit(&stopped, 6);
    let resumed = run(&a.iter().copied().filter(|s| *s != "-q").collect::<Vec<_>>());
    assert_exit(&resumed, 0);
    assert!(text(&resumed).1.contains("resuming from"), "{}", text(&resumed).1);
    let (s, want) = (json(&tmp.path().join("summary.json")), json(&reference.path().join("summary.json")));
    assert!(s["resumed_from_step"].as_u64().is_some_and(|n| n > 0), "{s}");
    for key in ["weights_sha256", "test_loss", "steps"] {
        assert_eq!(s[key], want[key], "{key}");
    }
}
