//! Inputs refused before anything runs, the binary end to end: non-finite and huge floats
//! (which used to panic in `Duration::from_secs_f64` with exit 101), files that are not specs,
//! cluster mistakes, a token file others can read, unknown `TRAINRUN_*` variables — each with
//! exit code 2 and a message that names the key, the value, where it came from and the fix.
//! `check` refuses exactly what a run refuses.

mod common;

use common::{assert_exit, run, text};
use std::process::{Output, Stdio};
use std::time::Duration;

/// Runs `trainrun` with `args` and `env`, at most 60 s.
fn run_env(args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut cmd = common::trainrun();
    cmd.args(args).stdout(Stdio::piped()).stderr(Stdio::piped());
    for (k, v) in env {
        cmd.env(k, v);
    }
    let child = cmd.spawn().unwrap_or_else(|e| panic!("cannot start trainrun: {e}"));
    common::wait_within(child, Duration::from_secs(60)).0
}

/// Both `check` and a run refuse `sets` with exit code 2 and stderr holding every `wants`.
fn refused_by_check_and_run(spec: &str, sets: &[&str], wants: &[&str]) {
    let mut args: Vec<&str> = Vec::new();
    for s in sets {
        args.extend(["--set", s]);
    }
    for command in [vec!["check", spec], vec![spec, "-q"]] {
        let all: Vec<&str> = command.iter().copied().chain(args.iter().copied()).collect();
        let out = run(&all);
        assert_exit(&out, 2);
        let (_, stderr) = text(&out);
        for want in wants {
            assert!(stderr.contains(want), "{all:?}: no {want:?} in\n{stderr}");
        }
    }
}

#[test]
fn non_finite_and_huge_durations_are_refused_not_panics() {
    for (set, want) in [
        (
            "strategy.communication.timeout_s=nan",
            "`strategy.communication.timeout_s` must be a finite number, found nan",
        ),
        (
            "strategy.communication.timeout_s=inf",
            "`strategy.communication.timeout_s` must be a finite number, found inf",
        ),
        (
            "strategy.communication.timeout_s=1e20",
            "`strategy.communication.timeout_s` must be at most 604800, found 1e20",
        ),
        ("cluster.restart_backoff_s=nan", "`cluster.restart_backoff_s` must be a finite number, found nan"),
        ("cluster.startup_timeout_s=nan", "`cluster.startup_timeout_s` must be a finite number, found nan"),
    ] {
        refused_by_check_and_run("specs/mnist_multiworker.toml", &[set], &[want, &format!("--> --set {set}")]);
    }
}

#[test]
fn optimizer_floats_out_of_their_range_are_refused() {
    for (set, want) in [
        ("optimizer.momentum=nan", "`optimizer.momentum` must be a finite number, found nan"),
        ("optimizer.momentum=1", "`optimizer.momentum` must be less than 1, found 1"),
        ("optimizer.weight_decay=inf", "`optimizer.weight_decay` must be a finite number, found inf"),
        ("optimizer.learning_rate=inf", "`optimizer.learning_rate` must be a finite number, found inf"),
        ("optimizer.learning_rate=0", "`optimizer.learning_rate` must be greater than 0, found 0"),
        ("optimizer.scaling={ rule = \"table\", table = { \"64\" = -0.1 } }", "must be greater than 0, found -0.1"),
    ] {
        refused_by_check_and_run("specs/mnist_single.toml", &[set], &[want]);
    }
}

#[test]
fn an_integer_too_large_is_called_too_large() {
    refused_by_check_and_run(
        "specs/mnist_single.toml",
        &["train.epochs=99999999999999999999"],
        &["`train.epochs` must be at most 18446744073709551615, found 99999999999999999999"],
    );
}

#[test]
fn a_derived_value_points_at_the_override_that_changed_its_table() {
    let out = run(&["check", "specs/mnist_multiworker.toml", "--set", "batch.per_replica=100000"]);
    assert_exit(&out, 2);
    let (_, stderr) = text(&out);
    assert!(stderr.contains("--> --set batch.per_replica=100000"), "{stderr}");
    assert!(!stderr.contains("[batch]"), "points at the file's [batch] instead:\n{stderr}");
}

#[test]
fn files_that_are_not_specs_are_refused_before_reading() {
    for (path, want) in [("/dev/zero", "it is a device, not a spec file"), ("specs", "it is a folder, not a spec file")]
    {
        let out = run_env(&["check", path], &[]);
        assert_exit(&out, 2);
        assert!(text(&out).1.contains(want), "{}", text(&out).1);
    }
    let dir = common::tempdir();
    let big = dir.path().join("big.toml");
    std::fs::File::create(&big).and_then(|f| f.set_len(17 << 20)).unwrap_or_else(|e| panic!("{e}"));
    let out = run_env(&["check", &big.display().to_string()], &[]);
    assert_exit(&out, 2);
    assert!(text(&out).1.contains("a spec has at most 16 MiB"), "{}", text(&out).1);
}

#[test]
fn a_task_flag_on_a_one_process_spec_is_refused() {
    let out = run_env(&["specs/mnist_single.toml", "-q", "--task", "worker:1"], &[]);
    assert_exit(&out, 2);
    assert!(text(&out).1.contains("--task worker:1 names a task of a cluster"), "{}", text(&out).1);
}

#[test]
fn explicit_clusters_need_distinct_dialable_addresses() {
    let cases = [
        ("cluster.worker=[\"127.0.0.1:2222\", \"127.0.0.1:2222\"]", "worker:0 and worker:1 both have the address"),
        ("cluster.worker=[\"127.0.0.1:2222\", \"127.0.0.1:0\"]", "has port 0"),
    ];
    for (set, want) in cases {
        let out = run(&["check", "specs/mnist_multiworker.toml", "--set", set]);
        assert_exit(&out, 2);
        let (_, stderr) = text(&out);
        assert!(stderr.contains(want) && stderr.contains(&format!("--> --set {set}")), "{stderr}");
    }
}

#[test]
fn a_token_file_others_can_read_is_refused_as_ssh_does() {
    use std::os::unix::fs::PermissionsExt;
    let dir = common::tempdir();
    let token = dir.path().join("job.token");
    std::fs::write(&token, "a-job-token-0123456789abcdef\n").unwrap_or_else(|e| panic!("{e}"));
    std::fs::set_permissions(&token, std::fs::Permissions::from_mode(0o644)).unwrap_or_else(|e| panic!("{e}"));
    let set = format!("cluster.token_file=\"{}\"", token.display());
    let out = run(&["check", "specs/mnist_multiworker.toml", "--set", &set]);
    assert_exit(&out, 2);
    let (_, stderr) = text(&out);
    assert!(stderr.contains("permissions 0644") && stderr.contains("chmod 600"), "{stderr}");
    std::fs::set_permissions(&token, std::fs::Permissions::from_mode(0o600)).unwrap_or_else(|e| panic!("{e}"));
    assert_exit(&run(&["check", "specs/mnist_multiworker.toml", "--set", &set]), 0);
}

#[test]
fn unknown_trainrun_variables_get_a_did_you_mean() {
    for (var, want) in [
        ("TRAINRUN_LEARNING_RATE", "did you mean `TRAINRUN_OPTIMIZER__LEARNING_RATE`?"),
        ("TRAINRUN_DATADIR", "did you mean `TRAINRUN_DATA_DIR`?"),
    ] {
        let out = run_env(&["check", "specs/mnist_single.toml"], &[(var, "0.1")]);
        assert_exit(&out, 2);
        let (_, stderr) = text(&out);
        assert!(stderr.contains(&format!("unknown environment variable `{var}`")) && stderr.contains(want), "{stderr}");
    }
}

#[test]
fn a_run_folder_that_cannot_be_made_names_run_out_dir() {
    let out = run_env(&["specs/mnist_single.toml", "-q", "--set", "run.out_dir=/proc/trainrun-nope"], &[]);
    assert_exit(&out, 2);
    let (_, stderr) = text(&out);
    assert!(
        stderr.contains("`run.out_dir` = \"/proc/trainrun-nope\" (from --set run.out_dir=/proc/trainrun-nope)")
            && stderr.contains("help: point run.out_dir at a folder"),
        "{stderr}"
    );
    // No restart cures it: the launcher fails the job at once, without "resuming from the
    // last backup" (issue 29).
    let out = run_env(
        &[
            "specs/mnist_multiworker.toml",
            "-q",
            "--set",
            "run.out_dir=/proc/trainrun-nope",
            "--set",
            "cluster.max_restarts=3",
        ],
        &[],
    );
    let (_, stderr) = text(&out);
    assert_ne!(out.status.code(), Some(0), "{stderr}");
    assert!(stderr.contains("cannot create the run folder `run.out_dir`"), "{stderr}");
    assert!(!stderr.contains("restarting"), "{stderr}");
}

#[test]
fn eval_of_a_path_that_is_no_checkpoint_says_so() {
    let dir = common::tempdir();
    let missing = dir.path().join("ckpt-0000000140").display().to_string();
    let out = run_env(&["eval", "specs/mnist_single.toml", "--checkpoint", &missing], &[]);
    let (_, stderr) = text(&out);
    assert!(stderr.contains("is not a checkpoint: no such folder"), "{stderr}");
    assert!(!stderr.contains("did not finish"), "{stderr}");
    let folder = dir.path().display().to_string();
    let out = run_env(&["eval", "specs/mnist_single.toml", "--checkpoint", &folder], &[]);
    assert!(text(&out).1.contains("it holds no manifest.json"), "{}", text(&out).1);
}

/// `trainrun check spec.toml | head`: a reader that went away ends trainrun quietly by
/// SIGPIPE, as any Unix tool, while sockets keep SIGPIPE ignored (tests/strangers.rs).
#[test]
fn a_closed_stdout_ends_quietly_by_sigpipe() {
    use std::os::fd::{FromRawFd, OwnedFd};
    use std::os::unix::process::ExitStatusExt;
    let mut fds = [0; 2];
    // SAFETY: pipe(2) fills the two descriptors we then own.
    assert_eq!(unsafe { libc::pipe(fds.as_mut_ptr()) }, 0);
    // SAFETY: both descriptors are fresh from pipe(2) and owned nowhere else.
    let (read, write) = unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
    drop(read);
    let out = common::trainrun()
        .args(["check", "specs/mnist_single.toml"])
        .stdout(Stdio::from(write))
        .stderr(Stdio::piped())
        .output()
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(out.status.signal(), Some(libc::SIGPIPE), "{:?}: {}", out.status, text(&out).1);
    assert_eq!(text(&out).1, "", "quiet");
}

#[test]
fn batch_and_step_counts_too_large_to_count_are_refused_naming_the_keys() {
    // 4 × 1 × 2^62 wrapped to a global batch of 0, and `check` divided by it (exit 101).
    refused_by_check_and_run(
        "specs/mnist_single.toml",
        &["batch.per_replica=4", "batch.accumulation_steps=4611686018427387904"],
        &[
            "batch.per_replica × replicas × batch.accumulation_steps = 4 × 1 × 4611686018427387904 is more examples per step than can be counted",
            "--> --set batch.accumulation_steps=4611686018427387904",
        ],
    );
    refused_by_check_and_run(
        "specs/mnist_multiworker.toml",
        &["batch.accumulation_steps=4611686018427387904"],
        &["64 × 2 × 4611686018427387904 is more examples per step than can be counted"],
    );
    // 2^62 × 4 = 2^64 used to plan "0 steps" and train without end; one less fits in a u64
    // but not in the signed step counters of TensorBoard and JSON readers.
    for epochs in ["4611686018427387904", "4611686018427387903"] {
        refused_by_check_and_run(
            "specs/mnist_single.toml",
            &[&format!("train.epochs={epochs}"), "train.steps_per_epoch=4"],
            &[
                &format!("train.epochs × steps per epoch = {epochs} × 4 = "),
                "more than the 9223372036854775807 a run can count",
                &format!("--> --set train.epochs={epochs}"),
            ],
        );
    }
}

#[test]
fn an_empty_training_split_says_what_is_empty_not_a_batch_of_at_most_0() {
    let dir = common::tempdir();
    let d = dir.path();
    // IDX files that declare 0 examples: valid headers, no data.
    std::fs::write(d.join("train-images"), [0, 0, 8, 3, 0, 0, 0, 0, 0, 0, 0, 28, 0, 0, 0, 28]).unwrap();
    std::fs::write(d.join("train-labels"), [0, 0, 8, 1, 0, 0, 0, 0]).unwrap();
    let spec = d.join("empty.toml");
    std::fs::write(
        &spec,
        format!(
            "extends = {:?}\n[data]\ndataset = \"idx\"\ndir = {:?}\n[data.files]\ntrain_images = \"train-images\"\ntrain_labels = \"train-labels\"\n",
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("specs/mnist_single.toml"),
            d
        ),
    )
    .unwrap();
    let spec = spec.to_str().unwrap();
    for args in [vec!["check", spec], vec![spec, "-q"]] {
        let out = run(&args);
        assert_exit(&out, 2);
        let (_, stderr) = text(&out);
        assert!(stderr.contains("the training split has no examples, so there is nothing to train on"), "{stderr}");
        assert!(stderr.contains("point [data] at a dataset with training examples"), "{stderr}");
        assert!(!stderr.contains("at most 0"), "{stderr}");
    }
}

#[test]
fn threads_beyond_the_cores_are_warned_about_in_check_and_at_start() {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let dir = common::tempdir();
    let threads = format!("run.threads={}", cores + 1);
    let out_dir = format!("run.out_dir={}", dir.path().display());
    let set = ["--set", &threads, "--set", &out_dir, "--set", "train.epochs=1", "--set", "train.steps_per_epoch=1"];
    let want = format!("run.threads = {} is more than the {cores} cores of this machine", cores + 1);
    for command in [vec!["check", "specs/mnist_single.toml"], vec!["specs/mnist_single.toml"]] {
        let args: Vec<&str> = command.into_iter().chain(set).collect();
        let out = run(&args);
        assert_exit(&out, 0);
        let (_, stderr) = text(&out);
        assert!(stderr.contains(&want), "{args:?}: no {want:?} in\n{stderr}");
        assert!(stderr.contains(&format!("use run.threads = {cores} or fewer")), "{stderr}");
    }
}

#[test]
fn a_gpt_on_images_is_refused_with_the_data_source_to_use() {
    let dir = common::tempdir();
    let spec = "[data]\ndataset = \"mnist\"\n[batch]\nglobal = 64\n[optimizer]\nkind = \"adamw\"\n\
                [model]\nzoo = \"gpt\"\n[model.gpt]\nn_layer = 2\n";
    let path = dir.path().join("gpt.toml");
    std::fs::write(&path, spec).unwrap();
    let path = path.to_str().unwrap();
    refused_by_check_and_run(
        path,
        &[],
        &["gpt needs sequences of token ids [T]", "zoo = \"gpt\"", "help: use a `text` or `tokens` data source"],
    );
    refused_by_check_and_run(
        path,
        &["model.zoo=mnist_cnn"],
        &["[model.gpt] sizes the gpt zoo model, but `zoo = \"gpt\"` is not set", "add `zoo = \"gpt\"` to [model]"],
    );
}

/// A failure timeout under two heartbeat intervals failed every multi-process run at start
/// (exit 5, naming no key) while `check` passed it (issue 29): both refuse it now, naming the
/// key and the minimum.
#[test]
fn a_failure_timeout_below_two_heartbeats_is_a_spec_error() {
    refused_by_check_and_run(
        "specs/mnist_multiworker.toml",
        &["strategy.communication.timeout_s=0.3"],
        &[
            "strategy.communication.timeout_s = 0.3 is below the 0.5 s",
            "use strategy.communication.timeout_s = 0.5 or more",
        ],
    );
    refused_by_check_and_run(
        "specs/mnist_parameter_server.toml",
        &["strategy.timeout_s=0.2"],
        &["strategy.timeout_s = 0.2 is below the 0.5 s"],
    );
    // One process has no heartbeats: nothing to refuse.
    assert_exit(
        &run(&[
            "check",
            "specs/mnist_multiworker.toml",
            "--set",
            "cluster.worker=1",
            "--set",
            "strategy.communication.timeout_s=0.3",
        ]),
        0,
    );
}

/// `trainrun certs` without `--for` on a spec whose [cluster] lists no task said "Slurm picks
/// the nodes" (issue 29): it says what is missing, `--for` and its values.
#[test]
fn certs_without_for_and_without_tasks_asks_for_for() {
    let dir = common::tempdir();
    let out = run(&["certs", "specs/mnist_single.toml", "--out", &dir.path().join("tls").display().to_string()]);
    assert_exit(&out, 2);
    let stderr = text(&out).1;
    assert!(stderr.contains("the spec's [cluster] lists no task") && stderr.contains("no `--for`"), "{stderr}");
    assert!(stderr.contains("`--for kubernetes`, `--for tfjob` or `--for slurm`"), "{stderr}");
    assert!(!stderr.contains("Slurm picks the nodes"), "{stderr}");
}

/// `trainrun report` called a `summary.json` that does not parse missing ("the run has not
/// finished", issue 29): it names the file, the line and column, and the parse error.
#[test]
fn report_names_a_corrupt_summary_with_its_line_and_column() {
    let dir = common::tempdir();
    let d = dir.path();
    std::fs::write(
        d.join("metrics.jsonl"),
        "{\"event\":\"step\",\"epoch\":1,\"step\":5,\"loss\":2.0,\"accuracy\":0.1}\n",
    )
    .unwrap();
    std::fs::write(d.join("summary.json"), "{\"steps\": 5,\n  \"test_loss\": }\n").unwrap();
    let out = run(&["report", &d.display().to_string()]);
    assert_exit(&out, 1);
    let stderr = text(&out).1;
    let file = d.join("summary.json");
    assert!(
        stderr.contains(&format!("{}:2:16: summary.json is corrupt, not missing: expected value", file.display())),
        "{stderr}"
    );
    assert!(stderr.contains("help: it was cut short or edited"), "{stderr}");
}

/// A sweep that one trial's bad file stopped named no trial (issue 29): it names the trial,
/// the values it sets and its folder, and keeps the file's exit code.
#[test]
fn a_sweep_stopped_by_one_trials_file_names_the_trial() {
    let dir = common::tempdir();
    let d = dir.path();
    let mut rows = String::from("a,y,b\n");
    for i in 0..64 {
        rows += &format!("{},{},{}\n", (i % 17) as f32 / 17.0, (i % 5) as f32 / 5.0, (i * 7 % 13) as f32 / 13.0);
    }
    std::fs::write(d.join("train.csv"), rows).unwrap();
    std::fs::write(d.join("bad.csv"), "a,y,b\n1,2\n").unwrap();
    let spec = d.join("sweep.toml");
    std::fs::write(
        &spec,
        format!(
            "[run]\nname = \"csvsweep\"\nout_dir = \"{out}\"\n[data]\ndataset = \"csv\"\ndir = \"{data}\"\n\
             [data.csv]\ntrain = \"train.csv\"\nlabel = \"y\"\n[batch]\nglobal = 8\n[optimizer]\nkind = \"sgd\"\n\
             learning_rate = 0.1\n[model]\n[[model.layers]]\ntype = \"dense\"\nunits = 1\n[train]\nepochs = 1\n\
             steps_per_epoch = 5\nloss = \"mean_squared_error\"\n[sweep]\nmetric = \"train_loss\"\nmode = \"min\"\n\
             [sweep.grid]\n\"data.csv.train\" = [\"train.csv\", \"bad.csv\"]\n",
            out = d.join("sweep").display(),
            data = d.display()
        ),
    )
    .unwrap();
    let out = run(&["sweep", &spec.display().to_string()]);
    assert_exit(&out, 4);
    let stderr = text(&out).1;
    assert!(
        stderr.contains("trial 2 of 2 (trial-002-") && stderr.contains("cannot run, so no trial was run"),
        "{stderr}"
    );
    assert!(stderr.contains("bad.csv: CSV error"), "{stderr}");
    assert!(
        stderr.contains("data.csv.train = \"bad.csv\"; its folder: ") && stderr.contains("/sweep/trial-002-"),
        "{stderr}"
    );
}
