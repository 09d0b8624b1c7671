//! Models too big for the machine (issue 29, item 3), the binary end to end: `check` prints
//! each task's memory estimate and exits 0, warning when this machine cannot hold the model;
//! a run refuses it with exit 3 in well under a second, before anything is allocated, naming
//! the estimate, its parts, the machine's memory and the keys to shrink.

mod common;

use common::{assert_exit, tempdir, text};
use std::path::{Path, PathBuf};
use std::process::{Output, Stdio};
use std::time::Duration;

/// The memory the tests plan for, whatever the machine has: results do not depend on it.
const LIMIT: &str = "64GiB";

/// Runs `trainrun` with `args` under [`LIMIT`] and a 4 GiB address-space cap, so a model that
/// slipped through could not endanger the host; at most 60 s.
fn run_capped(args: &[&str]) -> (Output, Duration) {
    let mut cmd = common::trainrun();
    cmd.args(args).env("TRAINRUN_MEMORY_LIMIT", LIMIT).stdout(Stdio::piped()).stderr(Stdio::piped());
    let cap = "ulimit -v 4194304 && exec \"$0\" \"$@\"";
    let mut capped = std::process::Command::new("sh");
    capped.arg("-c").arg(cap).arg(cmd.get_program()).args(cmd.get_args());
    for (k, v) in cmd.get_envs() {
        match v {
            Some(v) => capped.env(k, v),
            None => capped.env_remove(k),
        };
    }
    if let Some(dir) = cmd.get_current_dir() {
        capped.current_dir(dir);
    }
    capped.stdout(Stdio::piped()).stderr(Stdio::piped());
    let child = capped.spawn().unwrap_or_else(|e| panic!("cannot start trainrun: {e}"));
    common::wait_within(child, Duration::from_secs(60))
}

/// `check` warns and exits 0; the run exits 3 quickly; both name every part and `wants`.
fn refused(spec: &Path, sets: &[&str], wants: &[&str]) {
    let spec = spec.to_str().unwrap_or_default();
    let mut args: Vec<&str> = Vec::new();
    for s in sets {
        args.extend(["--set", s]);
    }
    for (command, code, lead) in [(vec!["check", spec], 0, "warning: "), (vec![spec, "-q"], 3, "error: ")] {
        let all: Vec<&str> = command.into_iter().chain(args.iter().copied()).collect();
        let (out, took) = run_capped(&all);
        assert_exit(&out, code);
        assert!(took < Duration::from_secs(10), "{all:?} took {took:?}");
        let (_, stderr) = text(&out);
        let parts =
            ["the model needs an estimated", "parameters", "gradients", "optimizer", "activations", "data held"];
        let machine = format!("more than this machine's {} (TRAINRUN_MEMORY_LIMIT)", "64.0 GiB");
        for want in parts.iter().chain(wants).chain([&machine.as_str(), &"= help: shrink "]) {
            assert!(stderr.contains(want), "{all:?}: no {want:?} in\n{stderr}");
        }
        assert!(stderr.starts_with(lead), "{all:?}:\n{stderr}");
        assert!(!stderr.contains("panicked") && !stderr.contains("memory allocation"), "{stderr}");
    }
}

fn shakespeare() -> PathBuf {
    PathBuf::from("specs/shakespeare_char.toml")
}

#[test]
fn check_prints_the_estimate_of_a_model_that_fits() {
    let (out, _) = run_capped(&["check", "specs/shakespeare_char.toml"]);
    assert_exit(&out, 0);
    let (stdout, stderr) = text(&out);
    let row = stdout.lines().find(|l| l.trim_start().starts_with("memory ")).unwrap_or_default();
    for want in ["per task: parameters 3.09 MiB", "gradients 6.19 MiB", "optimizer 6.19 MiB", "activations", "data"] {
        assert!(row.contains(want), "no {want:?} in {row:?}\n{stdout}");
    }
    assert!(!stderr.contains("needs an estimated"), "{stderr}");
}

#[test]
fn gpt_sizes_too_big_for_the_machine_are_refused_naming_the_key() {
    let spec = shakespeare();
    refused(&spec, &["model.gpt.n_layer=1000000000"], &["model.gpt.n_layer (1000000000 blocks"]);
    refused(&spec, &["model.gpt.n_embd=65536", "model.gpt.n_head=1"], &["model.gpt.n_embd (65536"]);
    refused(&spec, &["model.gpt.block_size=4000000000"], &["model.gpt.block_size (4000000000 positions"]);
    // 11 × 10¹⁸ parameters: more than a u64 of bytes, said so rather than wrapped.
    refused(&spec, &["model.gpt.n_embd=1000000000", "model.gpt.n_head=1"], &["more than 16 EiB", "model.gpt.n_embd"]);
}

#[test]
fn a_vocabulary_too_big_for_the_machine_is_refused() {
    let dir = tempdir();
    let ids: Vec<u8> = (0..4000u32).flat_map(|i| ((i % 50) as u16).to_le_bytes()).collect();
    for name in ["train.bin", "val.bin"] {
        std::fs::write(dir.path().join(name), &ids).unwrap_or_else(|e| panic!("{e}"));
    }
    let text = format!(
        "[run]\nout_dir = \"{out}\"\n[data]\ndataset = \"tokens\"\ndir = \"{data}\"\n[data.tokens]\ntrain = [\"train.bin\"]\nvalidation = [\"val.bin\"]\nblock_size = 16\nvocab_size = 4000000000\n[batch]\nglobal = 4\n[optimizer]\nkind = \"adamw\"\nlearning_rate = 1e-3\n[train]\nepochs = 1\nsteps_per_epoch = 2\nfrom_logits = true\n[model]\nzoo = \"gpt\"\n[model.gpt]\nn_layer = 1\nn_head = 2\nn_embd = 32\nblock_size = 16\n",
        out = dir.path().join("run").display(),
        data = dir.path().display()
    );
    let spec = dir.path().join("spec.toml");
    std::fs::write(&spec, text).unwrap_or_else(|e| panic!("{e}"));
    refused(&spec, &[], &["the vocabulary (4000000000 tokens"]);
}

/// A spec of a dense layer of `units` on a CSV table of two features and a class name.
fn csv_spec(dir: &Path, units: &str) -> PathBuf {
    let mut csv = String::from("a,b,label\n");
    for i in 0..40 {
        csv += &format!("{},{},{}\n", i % 7, i % 5, ["even", "odd"][i % 2]);
    }
    std::fs::write(dir.join("train.csv"), csv).unwrap_or_else(|e| panic!("{e}"));
    let text = format!(
        "[run]\nout_dir = \"{out}\"\n[data]\ndataset = \"csv\"\ndir = \"{data}\"\n[data.csv]\ntrain = \"train.csv\"\nlabel = \"label\"\n[batch]\nglobal = 8\n[optimizer]\nkind = \"sgd\"\nlearning_rate = 0.1\n[train]\nepochs = 1\nsteps_per_epoch = 2\nfrom_logits = true\n[model]\n[[model.layers]]\ntype = \"dense\"\nunits = {units}\nactivation = \"relu\"\n[[model.layers]]\ntype = \"dense\"\nunits = 2\n",
        out = dir.join("run").display(),
        data = dir.display()
    );
    let spec = dir.join("spec.toml");
    std::fs::write(&spec, text).unwrap_or_else(|e| panic!("{e}"));
    spec
}

#[test]
fn dense_layers_too_big_for_the_machine_are_refused_naming_the_layer() {
    let dir = tempdir();
    for units in ["1000000000", "1000000000000000000"] {
        let spec = csv_spec(dir.path(), units);
        refused(&spec, &[], &[&format!("model.layers[0].units ({units} units")]);
    }
    // The same table trains with a layer that fits.
    let spec = csv_spec(dir.path(), "16");
    let (out, _) = run_capped(&[spec.to_str().unwrap_or_default(), "-q"]);
    assert_exit(&out, 0);
}

/// `trainrun args` with `TRAINRUN_MEMORY_LIMIT=limit`: its exit code and stderr.
fn with_limit(args: &[&str], limit: &str) -> (i32, String) {
    let out = common::trainrun().args(args).env("TRAINRUN_MEMORY_LIMIT", limit).output();
    let out = out.unwrap_or_else(|e| panic!("cannot start trainrun: {e}"));
    (out.status.code().unwrap_or(-1), text(&out).1)
}

#[test]
fn the_memory_limit_variable_replaces_the_machine_and_is_checked() {
    let (code, stderr) = with_limit(&["specs/shakespeare_char.toml", "-q"], "100MiB");
    assert_eq!(code, 3, "{stderr}");
    assert!(stderr.contains("more than this machine's 100 MiB (TRAINRUN_MEMORY_LIMIT)"), "{stderr}");
    assert!(stderr.contains("batch.per_replica (now 6)"), "activations are the largest part:\n{stderr}");
    let (code, stderr) = with_limit(&["check", "specs/shakespeare_char.toml"], "lots");
    assert_eq!(code, 2, "{stderr}");
    assert!(stderr.contains("TRAINRUN_MEMORY_LIMIT=\"lots\" is not a memory size"), "{stderr}");
}
