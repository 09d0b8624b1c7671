//! The CUDA backend (the default `cuda` feature). What needs no GPU runs everywhere: the clear error
//! (and exit code 3) when the driver is missing, and NVRTC compiling every kernel (CI installs
//! NVRTC from PyPI). What needs a GPU prints `skipped: no GPU (…)` and returns without one:
//! numerics against the CPU engine, a one-device run end to end, NCCL with one rank.

#![cfg(feature = "cuda")]

mod common;

use common::{assert_exit, run, text};
use trainrun::engine::Shape;
use trainrun::engine::cuda::device::Gpu;
use trainrun::engine::cuda::nccl::{AllReduce, new_id};
use trainrun::engine::cuda::probe::{self, Library};
use trainrun::engine::cuda::{SgdConfig, kernels};
use trainrun::gpu_check::{self as check, Case, TOLERANCE};
use trainrun::spec::{ModelSpec, ZooModel};

/// Whether gpu:0 can train here; says why not when it cannot.
fn gpu() -> bool {
    match probe::training(&[0]) {
        Ok(()) => true,
        Err(e) => {
            println!("skipped: no GPU ({e})");
            false
        }
    }
}

fn zoo(model: ZooModel) -> ModelSpec {
    ModelSpec { zoo: Some(model), ..ModelSpec::default() }
}

#[test]
fn one_device_on_a_gpu_without_the_driver_names_it_and_exits_3() {
    if Library::Driver.present() {
        println!("skipped: this machine has the NVIDIA driver, so the missing-driver error cannot show");
        return;
    }
    for strategy in
        ["{ kind = \"one_device\", device = \"gpu:0\" }", "{ kind = \"mirrored\", devices = [\"gpu:0\", \"gpu:1\"] }"]
    {
        let out = run(&["specs/mnist_single.toml", "-q", "--set", &format!("strategy={strategy}")]);
        assert_exit(&out, 3);
        let (_, stderr) = text(&out);
        assert!(
            stderr.contains("GPU: libcuda.so (the NVIDIA driver) was not found: install the NVIDIA driver"),
            "{stderr}"
        );
        assert!(!stderr.contains("backtrace") && !stderr.contains("panicked"), "{stderr}");
    }
}

#[test]
fn the_probe_reports_the_driver_before_anything_else() {
    if Library::Driver.present() {
        println!("skipped: this machine has the NVIDIA driver");
        return;
    }
    let e = probe::training(&[0, 1]).err().map(|e| e.to_string()).unwrap_or_default();
    assert!(e.starts_with("libcuda.so (the NVIDIA driver) was not found"), "{e}");
}

#[test]
fn every_kernel_compiles_with_nvrtc() {
    if !Library::Nvrtc.present() {
        println!(
            "skipped: NVRTC not found ({}); `pip install nvidia-cuda-nvrtc` and put nvidia/cu13/lib on LD_LIBRARY_PATH, as .ci/run does",
            Library::Nvrtc.fix()
        );
        return;
    }
    let ptx = match kernels::compile() {
        Ok(p) => p.to_src(),
        Err(e) => panic!("{e}"),
    };
    for name in kernels::NAMES {
        assert!(ptx.contains(&format!(".entry {name}(")), "no entry point {name} in the PTX");
    }
}

#[test]
fn gpu_matches_cpu_on_the_tutorial_model() {
    if !gpu() {
        return;
    }
    let sgd = SgdConfig { momentum: 0.9, nesterov: false, weight_decay: 0.0 };
    let (spec, input) = (zoo(ZooModel::MnistCnn), Shape(vec![28, 28, 1]));
    let case = Case { index: 0, spec: &spec, input: &input, classes: 10, batch: 64, steps: 3 };
    let c = check::compare_with_cpu(case, sgd, 0.01).unwrap_or_else(|e| panic!("{e}"));
    println!("tutorial model: max relative difference {:.2e} ({}), losses {:?}", c.max_relative, c.worst, c.losses);
    assert!(c.max_relative <= TOLERANCE, "{c:?}");
}

#[test]
fn gpu_matches_cpu_on_resnet20() {
    if !gpu() {
        return;
    }
    let sgd = SgdConfig { momentum: 0.9, nesterov: true, weight_decay: 1e-4 };
    let (spec, input) = (zoo(ZooModel::Resnet20), Shape(vec![32, 32, 3]));
    let case = Case { index: 0, spec: &spec, input: &input, classes: 10, batch: 32, steps: 3 };
    let c = check::compare_with_cpu(case, sgd, 0.01).unwrap_or_else(|e| panic!("{e}"));
    println!("resnet20: max relative difference {:.2e} ({}), losses {:?}", c.max_relative, c.worst, c.losses);
    assert!(c.max_relative <= TOLERANCE, "{c:?}");
}

#[test]
fn one_device_gpu_run_trains_end_to_end() {
    if !gpu() {
        return;
    }
    let dir = common::tempdir();
    let out = run(&[
        "specs/mnist_single.toml",
        "-q",
        "--set",
        "strategy={ kind = \"one_device\", device = \"gpu:0\" }",
        "--set",
        "train.epochs=1",
        "--set",
        "train.steps_per_epoch=20",
        "--set",
        &format!("run.out_dir=\"{}\"", dir.path().display()),
    ]);
    assert_exit(&out, 0);
}

#[test]
fn nccl_with_one_rank_returns_its_input() {
    if !gpu() {
        return;
    }
    if !Library::Nccl.present() {
        println!("skipped: no NCCL ({})", Library::Nccl.fix());
        return;
    }
    let ptx = kernels::compile().map(|p| p.to_src()).unwrap_or_else(|e| panic!("{e}"));
    let gpu = Gpu::open(0, &ptx).unwrap_or_else(|e| panic!("{e}"));
    let id = new_id().unwrap_or_else(|e| panic!("{e}"));
    let comm = AllReduce::join(&gpu, 0, 1, id).unwrap_or_else(|e| panic!("{e}"));
    let values: Vec<f32> = (0..1000).map(|i| i as f32 * 0.5 - 7.0).collect();
    let mut buf = gpu.alloc_f32(values.len()).unwrap_or_else(|e| panic!("{e}"));
    gpu.upload(buf.ptr(), &values).unwrap_or_else(|e| panic!("{e}"));
    comm.sum_in_place(&mut buf).unwrap_or_else(|e| panic!("{e}"));
    let mut back = vec![0.0f32; values.len()];
    gpu.download(buf.ptr(), &mut back).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(back, values);
}

/// The GPU loss kernel does not sum regression errors: `mae` and `rmse` are refused up front
/// (exit 3, before the driver is probed) rather than written as a silent 0.
#[test]
fn regression_metrics_are_refused_on_a_gpu() {
    let dir = common::tempdir();
    let csv: String =
        std::iter::once("a,y\n".to_string()).chain((0..16).map(|i| format!("{i},{}.5\n", i % 2))).collect();
    for name in ["train.csv", "test.csv"] {
        std::fs::write(dir.path().join(name), &csv).unwrap();
    }
    for metric in ["mae", "rmse"] {
        let spec = format!(
            "[run]\nname = \"r\"\nout_dir = \"{out}\"\n[data]\ndataset = \"csv\"\ndir = \"{data}\"\n[data.csv]\ntrain = \"train.csv\"\ntest = \"test.csv\"\nlabel = \"y\"\n[strategy]\nkind = \"one_device\"\ndevice = \"gpu:0\"\n[batch]\nglobal = 4\n[optimizer]\nkind = \"sgd\"\nlearning_rate = 0.1\n[model]\n[[model.layers]]\ntype = \"dense\"\nunits = 1\n[train]\nepochs = 1\nloss = \"categorical_crossentropy\"\nfrom_logits = true\nmetrics = [\"{metric}\"]\n",
            out = dir.path().join("run").display(),
            data = dir.path().display(),
        );
        let path = dir.path().join(format!("{metric}.toml"));
        std::fs::write(&path, spec).unwrap();
        let out = run(&[path.to_str().unwrap(), "-q"]);
        assert_exit(&out, 3);
        let (_, stderr) = text(&out);
        assert!(stderr.contains(&format!("GPU: train.metrics = \"{metric}\" has no GPU kernel yet")), "{stderr}");
    }
}
