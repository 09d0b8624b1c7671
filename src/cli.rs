//! The command line, kept thin: the spec is the interface. `trainrun SPEC` runs it;
//! `check`, `eval`, `sample`, `tokenize`, `predict`, `export`, `sweep`, `report`, `manifest`, `certs`, `schema` and
//! `bench` are the only other commands.

use crate::exit::{Exit, RunError};
use crate::prepare::Invocation;
use crate::run;
use clap::{Args, Parser, Subcommand};
use std::num::NonZeroUsize;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Instant;

/// trainrun: declarative distributed training from one TOML spec.
#[derive(Debug, Parser)]
#[command(name = "trainrun", version, args_conflicts_with_subcommands = true, arg_required_else_help = true)]
pub struct Cli {
    #[command(subcommand)]
    command: Option<CliCommand>,
    #[command(flatten)]
    run: RunArgs,
}

#[derive(Debug, Subcommand)]
enum CliCommand {
    /// Print the plan (strategy, replicas, batch and learning-rate arithmetic, data shards,
    /// all-reduce, checkpoints) without training.
    Check {
        #[command(flatten)]
        spec: SpecArgs,
        /// Print the plan as JSON.
        #[arg(long)]
        json: bool,
    },
    /// Evaluate one checkpoint on the test split (the spec gives the model and the data).
    Eval {
        #[command(flatten)]
        spec: SpecArgs,
        /// The checkpoint folder, e.g. `runs/mnist/checkpoints/ckpt-0000000140`.
        #[arg(long, value_name = "PATH")]
        checkpoint: PathBuf,
    },
    /// Generate text from a trained language model (a spec with a `text` data source): the
    /// prompt, then --tokens drawn one at a time; the same seed gives the same text.
    Sample {
        #[command(flatten)]
        spec: SpecArgs,
        /// A checkpoint folder, a run folder (its final `model.safetensors`) or the file.
        #[arg(long, value_name = "PATH")]
        checkpoint: PathBuf,
        /// Text the generated tokens continue (every character must be in the vocabulary).
        #[arg(long, default_value = "\n")]
        prompt: String,
        /// Tokens to generate (at most 1,048,576).
        #[arg(long, default_value_t = 500)]
        tokens: usize,
        /// Divides the logits: below 1 is more conservative, above 1 more varied.
        // A negative value reaches sample's own check, which says what a temperature must be,
        // rather than clap's "to pass '-1' as a value, use '-- -1'".
        #[arg(long, default_value_t = 1.0, allow_negative_numbers = true)]
        temperature: f32,
        /// Draw only among the k likeliest tokens.
        #[arg(long = "top-k", value_name = "K")]
        top_k: Option<usize>,
        /// Seed of the draws.
        #[arg(long, default_value_t = 0)]
        seed: u64,
    },
    /// Tokenize a language model's corpus into the token cache ahead of a run, and report each
    /// file's tokens and the throughput; with --text, print that text's ids and pieces instead.
    Tokenize {
        #[command(flatten)]
        spec: SpecArgs,
        /// Text to tokenize with the spec's tokenizer (`\n` is a newline): its ids and pieces are
        /// printed and the corpus is not read (but for a `char` vocabulary).
        #[arg(long)]
        text: Option<String>,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Write the model's predictions for the test split or the --input files (the spec gives the
    /// model and the data): one row per example, in order; `.csv`, `.jsonl` or `.npy` by the
    /// output's extension.
    Predict {
        #[command(flatten)]
        spec: SpecArgs,
        /// A checkpoint folder, a run folder (its final `model.safetensors`) or the file.
        #[arg(long, value_name = "PATH")]
        checkpoint: PathBuf,
        /// Files to predict instead of the test split, read by the spec's data source (a CSV
        /// table, a `.npy` array, an IDX file, images or a folder of them), in order; repeat the
        /// flag or give several paths.
        #[arg(long, value_name = "FILE", num_args = 1..)]
        input: Vec<PathBuf>,
        /// The file to write, e.g. `predictions.csv`; an existing one is refused unless --force.
        #[arg(long, value_name = "FILE")]
        output: PathBuf,
        /// Classes listed per example, likeliest first.
        #[arg(long = "top-k", value_name = "K", default_value = "5")]
        top_k: NonZeroUsize,
        /// Replace an existing output file.
        #[arg(long)]
        force: bool,
        /// Print nothing but errors.
        #[arg(long, short)]
        quiet: bool,
    },
    /// Write a run's model for other tools: `--format onnx` for ONNX Runtime, `--format hf_gpt2`
    /// for Hugging Face `transformers` (a GPT; the run's own spec.toml gives the model).
    Export {
        /// A run folder, one of its checkpoint folders, or its `model.safetensors`.
        #[arg(value_name = "RUN_OR_CHECKPOINT")]
        path: PathBuf,
        /// The format to write.
        #[arg(long, value_enum)]
        format: crate::export::ExportFormat,
        /// The file (`model.onnx`) or, for hf_gpt2, the folder to write; an existing one is
        /// refused unless --force.
        #[arg(long, value_name = "PATH")]
        out: PathBuf,
        /// Replace an existing file.
        #[arg(long)]
        force: bool,
    },
    /// Run every trial of the spec's [sweep] as its own run under the sweep folder (the spec's
    /// run.out_dir), skipping trials already complete, then rank them in results.csv.
    Sweep {
        #[command(flatten)]
        spec: SpecArgs,
        /// Run this many trials at once (at most the machine's cores; each gets its share).
        #[arg(long, value_name = "K", default_value_t = NonZeroUsize::MIN)]
        parallel: NonZeroUsize,
        /// List the trials, their folders, seeds and values, and which are complete; run nothing.
        #[arg(long)]
        dry_run: bool,
        /// Run only the trial of this job-array index (0 to trials - 1: index I is trial I + 1)
        /// into its folder, as one index of a Slurm job array or Kubernetes Indexed Job does.
        #[arg(long, value_name = "INDEX", conflicts_with_all = ["dry_run", "collect", "parallel"])]
        trial: Option<usize>,
        /// Rank the trials that have finished (results.csv, sweep.json) without running any; the
        /// others are listed as failed or pending.
        #[arg(long, conflicts_with_all = ["dry_run", "parallel"])]
        collect: bool,
        /// Make exactly the decisions an asynchronous sweep (kind = "asha") recorded in FILE (its
        /// decisions.jsonl), whatever the timing, then decide on where the record ends.
        #[arg(long, value_name = "FILE", conflicts_with_all = ["trial", "collect"])]
        replay: Option<PathBuf>,
        /// Print nothing but errors.
        #[arg(long, short)]
        quiet: bool,
    },
    /// Draw the loss and accuracy curves of a run folder, or of every trial of a sweep folder,
    /// to SVG and PNG, with an HTML page (report.html) of the results and plots.
    Report {
        /// A run folder (with metrics.jsonl) or a sweep folder (with sweep.json).
        dir: PathBuf,
    },
    /// Print ready-to-apply job files for a cluster scheduler: Kubernetes (a ConfigMap, a
    /// headless Service and an Indexed Job), a Kubeflow TFJob, or a Slurm sbatch script. The
    /// spec's [deploy] section sets the image, resources, volume and node selector.
    Manifest {
        #[command(flatten)]
        spec: SpecArgs,
        /// The scheduler.
        #[arg(long = "for", value_enum, default_value = "kubernetes")]
        target: crate::deploy::Target,
        /// The container image (overrides deploy.image).
        #[arg(long)]
        image: Option<String>,
        /// The Kubernetes namespace of every object.
        #[arg(long)]
        namespace: Option<String>,
        /// For a sweep spec: trials the job array (Slurm `%` limit) or Indexed Job (parallelism)
        /// runs at once (default: all of them).
        #[arg(long, value_name = "P")]
        parallel: Option<NonZeroUsize>,
    },
    /// Make the TLS files cluster.tls names (a CA, and one certificate it signs for every name
    /// the tasks reach each other by where the job runs), into a folder.
    Certs {
        #[command(flatten)]
        spec: SpecArgs,
        /// The folder to write ca.crt, tls.crt and tls.key into (existing files are kept).
        #[arg(long)]
        out: PathBuf,
        /// Where the job runs (default: where the spec's [cluster] says).
        #[arg(long = "for", value_enum)]
        target: Option<crate::deploy::Target>,
        /// The Kubernetes namespace (TFJob task names carry it).
        #[arg(long)]
        namespace: Option<String>,
        /// Another host name, IP address or `*.` wildcard to cover (repeatable).
        #[arg(long = "name")]
        names: Vec<String>,
        /// Days the certificates are valid.
        #[arg(long, default_value_t = 365, value_parser = clap::value_parser!(u32).range(1..=3650))]
        days: u32,
    },
    /// Print the JSON Schema of specs (editors validate `#:schema` spec files with it).
    Schema,
    /// Measure training throughput of the tutorial model (batch 64 and 128, 1 and 2 threads).
    Bench {
        /// Fewer steps, for a quick look.
        #[arg(long)]
        quick: bool,
        /// Only one table, for A/B sittings that must fit a quiet window (default: every table).
        #[arg(long, value_enum)]
        only: Option<crate::bench::BenchPart>,
    },
}

#[derive(Debug, Args)]
struct SpecArgs {
    /// The spec file.
    spec: Option<PathBuf>,
    /// Override a spec value, e.g. `--set optimizer.learning_rate=0.05` (repeatable; applied
    /// after the file and TRAINRUN_* environment overrides).
    #[arg(long = "set", value_name = "KEY=VALUE")]
    sets: Vec<String>,
}

#[derive(Debug, Args)]
struct RunArgs {
    #[command(flatten)]
    spec: SpecArgs,
    /// Print nothing but errors.
    #[arg(long, short)]
    quiet: bool,
    /// Which task of the cluster this process is, e.g. `worker:1` (else `TRAINRUN_TASK`, or
    /// TF_CONFIG's `task`). Without one, a local cluster's tasks are started by this process.
    #[arg(long, value_name = "ROLE:INDEX")]
    task: Option<String>,
}

/// Parses the command line and runs it; returns the process exit code.
pub fn main() -> ExitCode {
    let launched = Instant::now();
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => {
            let _ = e.print();
            return if e.use_stderr() { Exit::Spec.into() } else { Exit::Ok.into() };
        }
    };
    let env: Vec<(String, String)> = std::env::vars().collect();
    let invocation = |spec: SpecArgs, quiet: bool, task: Option<String>| -> Result<Invocation, RunError> {
        let path = spec.spec.ok_or_else(|| {
            RunError::Usage("a spec file is required, e.g. `trainrun specs/mnist_single.toml`".into())
        })?;
        Ok(Invocation { spec: path, sets: spec.sets, env: env.clone(), quiet, task, launched })
    };
    let result = match cli.command {
        None => invocation(cli.run.spec, cli.run.quiet, cli.run.task).and_then(|inv| run::train(&inv)).map(|_| ()),
        Some(CliCommand::Check { spec, json }) => invocation(spec, false, None).and_then(|inv| run::check(&inv, json)),
        Some(CliCommand::Eval { spec, checkpoint }) => {
            invocation(spec, false, None).and_then(|inv| run::eval(&inv, &checkpoint))
        }
        Some(CliCommand::Sample { spec, checkpoint, prompt, tokens, temperature, top_k, seed }) => {
            // A shell cannot easily pass a newline: `\n` in the prompt is one.
            let prompt = prompt.replace("\\n", "\n");
            let options = run::SampleOptions { prompt, tokens, temperature, top_k, seed };
            invocation(spec, false, None).and_then(|inv| run::sample(&inv, &checkpoint, &options))
        }
        Some(CliCommand::Tokenize { spec, text, json }) => {
            let text = text.map(|t| t.replace("\\n", "\n"));
            invocation(spec, false, None).and_then(|inv| run::tokenize(&inv, text.as_deref(), json))
        }
        Some(CliCommand::Predict { spec, checkpoint, input, output, top_k, force, quiet }) => {
            let options = run::PredictOptions { inputs: input, output, top_k, force };
            invocation(spec, quiet, None).and_then(|inv| run::predict(&inv, &checkpoint, &options))
        }
        Some(CliCommand::Export { path, format, out, force }) => run::export(&path, format, &out, force, env.clone()),
        Some(CliCommand::Sweep { spec, parallel, dry_run, trial, collect, replay, quiet }) => {
            let part = match (trial, collect) {
                (Some(index), _) => crate::sweep::SweepPart::Trial(index),
                (None, true) => crate::sweep::SweepPart::Collect,
                (None, false) => crate::sweep::SweepPart::Every,
            };
            let options = crate::sweep::SweepOptions { parallel: parallel.get(), dry_run, part, replay };
            invocation(spec, quiet, None).and_then(|inv| crate::sweep::run(&inv, &options))
        }
        Some(CliCommand::Report { dir }) => crate::report::run(&dir),
        Some(CliCommand::Manifest { spec, target, image, namespace, parallel }) => {
            invocation(spec, false, None).and_then(|inv| crate::deploy::run(&inv, target, image, namespace, parallel))
        }
        Some(CliCommand::Certs { spec, out, target, namespace, names, days }) => {
            let options = crate::deploy::certs::CertsOptions { target, namespace, names, days };
            invocation(spec, false, None).and_then(|inv| crate::deploy::certs::run(&inv, &options, &out))
        }
        Some(CliCommand::Schema) => {
            print!("{}", crate::spec::schema_json());
            Ok(())
        }
        Some(CliCommand::Bench { quick, only }) => crate::bench::run(quick, only).map_err(RunError::Failure),
    };
    match result {
        Ok(()) => Exit::Ok.into(),
        Err(e) => {
            eprintln!("{e}");
            // A task the launcher started (it sets TRAINRUN_PROGRESS) tells it whom it blames,
            // as data: the launcher names a hung task from this line, not from the words.
            if let Some(blame) = e.blame().filter(|_| env.iter().any(|(k, _)| k == "TRAINRUN_PROGRESS")) {
                println!("{}", crate::cluster::launch::blame_line(blame));
            }
            ExitCode::from(e.exit())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    /// The spec is the interface: a new flag needs a reason, and this test makes it visible.
    #[test]
    fn the_flag_list_stays_small() {
        let cmd = Cli::command();
        let mut flags: Vec<String> = Vec::new();
        let mut collect = |prefix: &str, c: &clap::Command| {
            for a in c.get_arguments() {
                if let Some(l) = a.get_long() {
                    flags.push(format!("{prefix}--{l}"));
                }
            }
        };
        collect("", &cmd);
        for sub in cmd.get_subcommands() {
            collect(&format!("{} ", sub.get_name()), sub);
        }
        flags.sort();
        assert_eq!(
            flags,
            [
                "--quiet",
                "--set",
                "--task",
                "bench --only",
                "bench --quick",
                "certs --days",
                "certs --for",
                "certs --name",
                "certs --namespace",
                "certs --out",
                "certs --set",
                "check --json",
                "check --set",
                "eval --checkpoint",
                "eval --set",
                "export --force",
                "export --format",
                "export --out",
                "manifest --for",
                "manifest --image",
                "manifest --namespace",
                "manifest --parallel",
                "manifest --set",
                "predict --checkpoint",
                "predict --force",
                "predict --input",
                "predict --output",
                "predict --quiet",
                "predict --set",
                "predict --top-k",
                "sample --checkpoint",
                "sample --prompt",
                "sample --seed",
                "sample --set",
                "sample --temperature",
                "sample --tokens",
                "sample --top-k",
                "sweep --collect",
                "sweep --dry-run",
                "sweep --parallel",
                "sweep --quiet",
                "sweep --replay",
                "sweep --set",
                "sweep --trial",
                "tokenize --json",
                "tokenize --set",
                "tokenize --text",
            ],
            "CLI flags changed: keep options in the spec (`--set` reaches every key)"
        );
    }
}
