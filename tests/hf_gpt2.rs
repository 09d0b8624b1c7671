//! Hugging Face GPT-2 in and out, end to end: a tiny GPT-2 that `transformers` saved
//! (tests/fixtures/hf_gpt2/tiny, made by make_fixture.py beside it) fine-tunes under
//! `init_from`, found by its config.json; `trainrun export --format hf_gpt2` writes it back
//! bit-exact, and `transformers` loads the written folder and computes the fixture's logits
//! (when python3 can import torch and transformers; else the test says so loudly and skips that
//! check); `--format onnx` writes the GPT as a graph ONNX Runtime runs to the same logits. The logits of the load itself are compared in src/checkpoint/hf_gpt2_tests.rs.

mod common;

use common::{assert_exit, run, short_mnist_run, tempdir, text, weights, with_python};
use std::path::Path;

const FIXTURE: &str = "tests/fixtures/hf_gpt2";

/// A byte-level GPT of the fixture's sizes (256 ids, 16 positions, 2 layers, 4 heads, 32 wide)
/// over a small text in `dir`, one step at learning rate 1e-30: its weights stay what it loaded.
fn write_spec(dir: &Path, init: &str) -> String {
    let words = "the quick brown fox jumps over the lazy dog; GPT-2 reads bytes here.\n".repeat(60);
    std::fs::write(dir.join("train.txt"), words).unwrap();
    let spec = format!(
        "[run]\nname = \"hf\"\nout_dir = \"{out}\"\n[data]\ndataset = \"text\"\ndir = \"{dir}\"\n[data.text]\n\
         train = [\"train.txt\"]\ntokenization = \"byte\"\nblock_size = 16\n[batch]\nglobal = 4\n\
         [optimizer]\nkind = \"adamw\"\nlearning_rate = 1e-30\n[train]\nepochs = 1\nsteps_per_epoch = 1\n\
         from_logits = true\n[model]\nzoo = \"gpt\"\ninit_from = {init}\n[model.gpt]\nn_layer = 2\nn_head = 4\n\
         n_embd = 32\nblock_size = 16\napproximate_gelu = true\n",
        out = dir.join("run").display(),
        dir = dir.display(),
    );
    let path = dir.join("spec.toml");
    std::fs::write(&path, spec).unwrap();
    path.to_str().unwrap().to_string()
}

/// `trainrun export RUN --format FORMAT --out OUT`.
fn export(run_dir: &Path, format: &str, out: &Path) -> std::process::Output {
    run(&["export", run_dir.to_str().unwrap(), "--format", format, "--out", out.to_str().unwrap()])
}

fn fixture() -> String {
    std::fs::canonicalize(FIXTURE).unwrap().join("tiny").display().to_string()
}

#[test]
fn a_transformers_gpt2_fine_tunes_and_exports_back_bit_exact() {
    let tmp = tempdir();
    let spec = write_spec(tmp.path(), &format!("{{ path = \"{}\" }}", fixture()));
    let check = run(&["check", &spec]);
    assert_exit(&check, 0);
    assert!(
        text(&check).0.contains("warm start: will load from") && text(&check).0.contains("28 tensors"),
        "{:?}",
        text(&check)
    );
    let out = run(&[&spec]);
    assert_exit(&out, 0);
    let stderr = text(&out).1;
    assert!(stderr.contains("warm start from") && stderr.contains("28 tensors"), "{stderr}");

    let exported = tmp.path().join("exported");
    let out = export(&tmp.path().join("run"), "hf_gpt2", &exported);
    assert_exit(&out, 0);
    assert!(text(&out).1.contains("GPT2LMHeadModel.from_pretrained"), "{:?}", text(&out));
    assert!(text(&out).1.contains("no tokenizer files: a char or byte vocabulary"), "{:?}", text(&out));
    let (ours, theirs) =
        (weights(&exported.join("model.safetensors")), weights(&Path::new(FIXTURE).join("tiny/model.safetensors")));
    assert_eq!(ours.iter().map(|(n, _)| n).collect::<Vec<_>>(), theirs.iter().map(|(n, _)| n).collect::<Vec<_>>());
    for ((name, a), (_, b)) in ours.iter().zip(&theirs) {
        assert!(a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits()), "{name} changed on the way through trainrun");
    }
    let config: serde_json::Value =
        serde_json::from_slice(&std::fs::read(exported.join("config.json")).unwrap()).unwrap();
    let fixture_config: serde_json::Value =
        serde_json::from_slice(&std::fs::read(Path::new(FIXTURE).join("tiny/config.json")).unwrap()).unwrap();
    for key in [
        "model_type",
        "vocab_size",
        "n_positions",
        "n_embd",
        "n_layer",
        "n_head",
        "activation_function",
        "layer_norm_epsilon",
        "tie_word_embeddings",
    ] {
        assert_eq!(config[key], fixture_config[key], "config.json's {key}");
    }
    // An existing folder is refused unless --force.
    let again = export(&tmp.path().join("run"), "hf_gpt2", &exported);
    assert_exit(&again, 2);
    assert!(text(&again).1.contains("--force"), "{:?}", text(&again));

    let script = "import sys, json, torch\n\
        from transformers import GPT2LMHeadModel\n\
        model = GPT2LMHeadModel.from_pretrained(sys.argv[1]).eval()\n\
        ref = json.load(open(sys.argv[2]))\n\
        ids = torch.tensor(ref['ids'])\n\
        with torch.no_grad():\n    out = model(input_ids=ids, labels=ids)\n\
        worst = (out.logits - torch.tensor(ref['logits'])).abs().max().item()\n\
        assert worst <= 1e-4, f'logits differ by {worst}'\n\
        assert abs(out.loss.item() - ref['loss']) <= 1e-4 * ref['loss'], (out.loss.item(), ref['loss'])\n\
        print('transformers loaded the export: logits within', worst)\n";
    let reference = std::fs::canonicalize(Path::new(FIXTURE).join("tiny_logits.json")).unwrap();
    let reference = format!("{:?}", reference.display().to_string());
    with_python("torch, transformers", &script.replace("sys.argv[2]", &reference), &exported);

    // The same GPT as ONNX: the checker passes and ONNX Runtime computes transformers' logits.
    let onnx = tmp.path().join("gpt.onnx");
    let out = export(&tmp.path().join("run"), "onnx", &onnx);
    assert_exit(&out, 0);
    assert!(text(&out).1.contains("ONNX opset 17") && text(&out).1.contains("int64 token ids"), "{:?}", text(&out));
    let script = "import sys, os, json, numpy as np, onnx, onnxruntime as ort\n\
        path = os.path.join(sys.argv[1], 'gpt.onnx')\n\
        onnx.checker.check_model(onnx.load(path), full_check=True)\n\
        ref = json.load(open(REFERENCE))\n\
        y = ort.InferenceSession(path).run(['output'], {'input': np.array(ref['ids'], dtype=np.int64)})[0]\n\
        worst = np.abs(y - np.array(ref['logits'], dtype=np.float32)).max()\n\
        assert worst <= 1e-4, worst\n\
        print('ONNX Runtime: logits within', worst)\n";
    with_python("onnxruntime", &script.replace("REFERENCE", &reference), tmp.path());
}

#[test]
fn a_gpt2_of_other_sizes_or_another_model_type_is_refused_naming_why() {
    let tmp = tempdir();
    let spec = write_spec(tmp.path(), &format!("{{ path = \"{}\", format = \"hf_gpt2\" }}", fixture()));
    let out = run(&[&spec, "--set", "model.gpt.n_head=2", "--set", "model.gpt.approximate_gelu=false"]);
    assert_exit(&out, 1);
    let stderr = text(&out).1;
    assert!(stderr.contains("n_head: config.json has 4, the spec's model has 2"), "{stderr}");
    assert!(stderr.contains("activation_function: config.json has gelu_new"), "{stderr}");

    let llama = tmp.path().join("llama");
    std::fs::create_dir(&llama).unwrap();
    std::fs::write(llama.join("config.json"), r#"{"model_type": "llama"}"#).unwrap();
    let spec = write_spec(tmp.path(), &format!("{{ path = \"{}\" }}", llama.display()));
    let out = run(&["check", &spec]);
    assert_ne!(out.status.code(), Some(0));
    assert!(text(&out).1.contains("model_type is \"llama\""), "{:?}", text(&out));
}

#[test]
fn export_hf_gpt2_refuses_a_model_that_is_not_a_gpt() {
    let tmp = tempdir();
    let run_dir = tmp.path().join("mnist");
    short_mnist_run(&run_dir, 2);
    let out = export(&run_dir, "hf_gpt2", &tmp.path().join("x"));
    assert_ne!(out.status.code(), Some(0));
    let stderr = text(&out).1;
    assert!(
        stderr.contains("--format hf_gpt2 writes a GPT-2") && stderr.contains("where an embedding belongs"),
        "{stderr}"
    );
    assert!(!tmp.path().join("x").exists());
}

/// A GPT trained on tiktoken's GPT-2 ids, or on a `tokenizer.json`'s, exports its tokenizer
/// beside its weights: `transformers`' `AutoTokenizer` loads the folder and encodes text to the
/// ids `trainrun tokenize` gives (emoji, CJK, digits and runs of spaces included).
#[test]
fn an_exported_gpt2_folder_holds_the_tokenizer_the_run_trained_with() {
    let sample = "ROMEO: But, soft! what light through yonder window breaks?\n   It is the east, 2,024 🙂 日本語.";
    let bpe = std::fs::canonicalize("specs/tokenizers/shakespeare_bpe.json").unwrap();
    let cases = [
        ("\"gpt2\"".to_string(), &["vocab.json", "merges.txt", "tokenizer_config.json", "special_tokens_map.json"][..]),
        (
            format!("{{ tokenizer_json = {:?} }}", bpe.display().to_string()),
            &["tokenizer.json", "tokenizer_config.json"][..],
        ),
    ];
    for (tokenization, written) in cases {
        let tmp = tempdir();
        std::fs::write(tmp.path().join("train.txt"), "the quick brown fox jumps over the lazy dog.\n".repeat(20))
            .unwrap();
        let spec = tmp.path().join("spec.toml");
        std::fs::write(
            &spec,
            format!(
                "[run]\nname = \"tok\"\nout_dir = \"{out}\"\n[data]\ndataset = \"text\"\ndir = \"{dir}\"\n\
                 [data.text]\ntrain = [\"train.txt\"]\ntokenization = {tokenization}\nblock_size = 8\n[batch]\n\
                 global = 2\n[optimizer]\nkind = \"adamw\"\nlearning_rate = 0.001\n[train]\nepochs = 1\n\
                 steps_per_epoch = 1\nfrom_logits = true\n[model]\nzoo = \"gpt\"\n[model.gpt]\nn_layer = 1\n\
                 n_head = 2\nn_embd = 8\nblock_size = 8\n",
                out = tmp.path().join("run").display(),
                dir = tmp.path().display(),
            ),
        )
        .unwrap();
        let spec = spec.to_str().unwrap();
        assert_exit(&run(&[spec, "-q"]), 0);
        let exported = tmp.path().join("exported");
        let out = export(&tmp.path().join("run"), "hf_gpt2", &exported);
        assert_exit(&out, 0);
        assert!(text(&out).1.contains("AutoTokenizer.from_pretrained"), "{:?}", text(&out));
        for file in written {
            assert!(exported.join(file).is_file(), "{tokenization}: no {file} in {:?}", text(&out));
        }
        let shown = run(&["tokenize", spec, "--text", sample, "--json"]);
        assert_exit(&shown, 0);
        let ids: serde_json::Value = serde_json::from_str(&text(&shown).0).unwrap();
        let script = format!(
            "import sys\nfrom transformers import AutoTokenizer\n\
             tok = AutoTokenizer.from_pretrained(sys.argv[1])\n\
             ids = tok.encode({sample:?}, add_special_tokens=False)\n\
             assert ids == {expected}, (ids, {expected})\n\
             print('transformers encodes as trainrun:', len(ids), 'ids')\n",
            expected = ids["ids"],
        );
        with_python("transformers", &script, &exported);
    }
}
