//! The shape of the house, checked on the source: the runtime takes the typed plan and never
//! reads the spec; top-level modules depend on each other without cycles; files and functions
//! stay small; a type name means one thing. Each failure names the files to fix (`docs/architecture.md` says how).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// Modules that run a planned job: they take the plan (or their slice of it), not the spec.
const RUNTIME: [&str; 10] =
    ["train", "strategy", "collective", "engine", "data", "checkpoint", "builder", "cluster", "model", "metrics"];

/// The cluster's resolution half: it turns `[cluster]`, TF_CONFIG, Slurm or Kubernetes into the
/// cluster the plan holds, so it reads the spec's `[cluster]` section. These four files are
/// planning that lives beside the cluster types it produces (`Cluster`, `Address`, `Role`): they
/// run before the plan exists (`prepare`), and `deploy` uses the same rules to write manifests.
/// Nothing they define is used once the job runs.
const RESOLUTION: [&str; 4] =
    ["src/cluster/resolve.rs", "src/cluster/tf_config.rs", "src/cluster/slurm.rs", "src/cluster/kubernetes.rs"];

/// Longest file, in lines.
const MAX_FILE_LINES: usize = 600;

/// Longest function, in lines.
const MAX_FN_LINES: usize = 120;

/// Every `.rs` file under `src/`, with its text.
fn sources() -> Vec<(PathBuf, String)> {
    fn walk(dir: &Path, out: &mut Vec<(PathBuf, String)>) {
        let Ok(entries) = std::fs::read_dir(dir) else {
            panic!("cannot read {}; run tests from the package root", dir.display())
        };
        let mut paths: Vec<PathBuf> = entries.flatten().map(|e| e.path()).collect();
        paths.sort();
        for p in paths {
            if p.is_dir() {
                walk(&p, out);
            } else if p.extension().is_some_and(|e| e == "rs") {
                let text = std::fs::read_to_string(&p).unwrap_or_default();
                out.push((p, text));
            }
        }
    }
    let mut out = Vec::new();
    walk(Path::new("src"), &mut out);
    out
}

/// Whether a file holds only tests (`tests.rs`, `*_tests.rs`).
fn test_file(path: &Path) -> bool {
    let name = path.file_name().and_then(|n| n.to_str()).unwrap_or_default();
    name == "tests.rs" || name.ends_with("_tests.rs")
}

/// The file's code without its trailing test module and without comments.
fn code(text: &str) -> String {
    let end = text.find("#[cfg(test)]\nmod tests").unwrap_or(text.len());
    text[..end]
        .lines()
        .map(|l| match l.find("//") {
            Some(i) if !l[..i].contains('"') => &l[..i],
            _ => l,
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// The top-level module a file under `src/` belongs to (`src/train/fit.rs` → `train`).
fn module(path: &Path) -> String {
    let rel = path.strip_prefix("src").unwrap_or(path);
    let first = rel.components().next().map(|c| c.as_os_str().to_string_lossy().into_owned()).unwrap_or_default();
    first.trim_end_matches(".rs").to_string()
}

/// `crate::name` references in `code`.
fn uses(code: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    let mut rest = code;
    while let Some(i) = rest.find("crate::") {
        let after = &rest[i + 7..];
        let name: String = after.chars().take_while(|c| c.is_ascii_lowercase() || *c == '_').collect();
        if !name.is_empty() {
            out.insert(name);
        }
        rest = after;
    }
    out
}

#[test]
fn the_runtime_never_reads_the_spec() {
    let offenders: Vec<String> = sources()
        .into_iter()
        .filter(|(p, _)| RUNTIME.contains(&module(p).as_str()) && !test_file(p))
        .filter(|(p, _)| !RESOLUTION.iter().any(|r| Path::new(r) == p))
        .filter(|(_, text)| uses(&code(text)).contains("spec"))
        .map(|(p, _)| p.display().to_string())
        .collect();
    assert!(
        offenders.is_empty(),
        "runtime files import crate::spec; take the typed plan (or a type the plan holds) instead:\n  {}",
        offenders.join("\n  ")
    );
}

#[test]
fn top_level_modules_form_no_cycle() {
    // module -> (dependency -> files that use it)
    let mut graph: BTreeMap<String, BTreeMap<String, BTreeSet<String>>> = BTreeMap::new();
    for (path, text) in sources().into_iter().filter(|(p, _)| !test_file(p)) {
        let from = module(&path);
        for to in uses(&code(&text)).into_iter().filter(|to| *to != from) {
            graph.entry(from.clone()).or_default().entry(to).or_default().insert(path.display().to_string());
        }
    }
    // Depth-first search for a back edge; report the cycle with the files behind each edge.
    fn visit(
        node: &str,
        graph: &BTreeMap<String, BTreeMap<String, BTreeSet<String>>>,
        stack: &mut Vec<String>,
        done: &mut BTreeSet<String>,
    ) -> Option<Vec<String>> {
        if let Some(i) = stack.iter().position(|n| n == node) {
            let mut cycle = stack[i..].to_vec();
            cycle.push(node.to_string());
            return Some(cycle);
        }
        if done.contains(node) {
            return None;
        }
        stack.push(node.to_string());
        for next in graph.get(node).into_iter().flat_map(|m| m.keys()) {
            if let Some(c) = visit(next, graph, stack, done) {
                return Some(c);
            }
        }
        stack.pop();
        done.insert(node.to_string());
        None
    }
    let mut done = BTreeSet::new();
    for node in graph.keys() {
        if let Some(cycle) = visit(node, &graph, &mut Vec::new(), &mut done) {
            let edges: Vec<String> = cycle
                .windows(2)
                .map(|w| {
                    format!(
                        "{} -> {} (in {})",
                        w[0],
                        w[1],
                        graph[&w[0]][&w[1]].iter().cloned().collect::<Vec<_>>().join(", ")
                    )
                })
                .collect();
            panic!("modules depend on each other in a cycle; move the shared part down:\n  {}", edges.join("\n  "));
        }
    }
}

#[test]
fn files_stay_small() {
    let big: Vec<String> = sources()
        .into_iter()
        .map(|(p, t)| (p, t.lines().count()))
        .filter(|(_, n)| *n > MAX_FILE_LINES)
        .map(|(p, n)| format!("{} ({n} lines)", p.display()))
        .collect();
    assert!(big.is_empty(), "files over {MAX_FILE_LINES} lines; split them along a seam:\n  {}", big.join("\n  "));
}

/// Functions and their lengths: from a line whose code starts with `fn`/`pub fn`/… to the
/// first later line that closes at the same indentation.
fn functions(text: &str) -> Vec<(String, usize, usize)> {
    let lines: Vec<&str> = text.lines().collect();
    let mut out = Vec::new();
    for (i, line) in lines.iter().enumerate() {
        let trimmed = line.trim_start();
        let indent = line.len() - trimmed.len();
        let is_fn = ["fn ", "pub fn ", "pub(crate) fn ", "pub(super) fn ", "async fn ", "pub async fn "]
            .iter()
            .any(|p| trimmed.starts_with(p));
        if !is_fn || trimmed.ends_with(';') {
            continue;
        }
        let close = format!("{}}}", " ".repeat(indent));
        if let Some(end) = lines[i + 1..].iter().position(|l| *l == close) {
            let name = trimmed.split("fn ").nth(1).and_then(|r| r.split(['(', '<']).next()).unwrap_or(trimmed);
            let name = format!("fn {name}");
            out.push((name, i + 1, end + 2));
        }
    }
    out
}

#[test]
fn functions_stay_short() {
    let long: Vec<String> = sources()
        .into_iter()
        .filter(|(p, _)| !test_file(p))
        .flat_map(|(p, text)| {
            let code_end = text.find("#[cfg(test)]\nmod tests").unwrap_or(text.len());
            functions(&text[..code_end])
                .into_iter()
                .filter(|(_, _, len)| *len > MAX_FN_LINES)
                .map(move |(name, line, len)| format!("{}:{line} {name} ({len} lines)", p.display()))
                .collect::<Vec<_>>()
        })
        .collect();
    assert!(long.is_empty(), "functions over {MAX_FN_LINES} lines; split them:\n  {}", long.join("\n  "));
}

/// Clippy's `too_many_arguments` is never silenced: a wide signature takes a context value
/// (`engine::layer::Backward`) or a small struct instead.
#[test]
fn no_function_silences_too_many_arguments() {
    let allowed: Vec<String> = sources()
        .into_iter()
        .flat_map(|(p, text)| {
            text.lines()
                .enumerate()
                .filter(|(_, l)| l.contains("too_many_arguments"))
                .map(|(i, _)| format!("{}:{}", p.display(), i + 1))
                .collect::<Vec<_>>()
        })
        .collect();
    assert!(
        allowed.is_empty(),
        "`too_many_arguments` allowed; pass a context value or a small struct instead:\n  {}",
        allowed.join("\n  ")
    );
}

#[test]
fn the_checks_see_what_they_check() {
    // A check that finds nothing to check would pass vacuously.
    let all = sources();
    assert!(all.len() > 100, "{} source files", all.len());
    assert!(all.iter().any(|(p, t)| module(p) == "train" && uses(&code(t)).contains("plan")));
    assert!(all.iter().any(|(p, t)| module(p) == "plan" && uses(&code(t)).contains("spec")));
    assert!(functions("fn a() {\n    x\n}\n").first().is_some_and(|f| f.2 == 3));
}

/// Sources that serve more than one `data.dataset` name, by the file that holds them.
const SOURCE_FAMILIES: [(&str, &str); 3] = [("fashion_mnist", "mnist"), ("cifar10", "cifar"), ("cifar100", "cifar")];

/// The `data.dataset` names: the variants of `spec::DatasetKind`, in snake case.
fn dataset_names() -> Vec<String> {
    let text = std::fs::read_to_string("src/spec/data.rs").unwrap_or_default();
    let Some(start) = text.find("pub enum DatasetKind {") else { return vec![] };
    let body = &text[start..];
    let body = &body[..body.find("\n}").unwrap_or(body.len())];
    body.lines()
        .filter_map(|l| l.strip_prefix("    ")?.strip_suffix(','))
        .filter(|v| v.starts_with(|c: char| c.is_ascii_uppercase()))
        .map(|v| {
            v.chars().enumerate().fold(String::new(), |mut s, (i, c)| {
                if c.is_ascii_uppercase() && i > 0 {
                    s.push('_');
                }
                s.push(c.to_ascii_lowercase());
                s
            })
        })
        .collect()
}

#[test]
fn each_data_source_is_in_its_own_file() {
    // Every `impl DataSource for` is alone in a file of src/data/source/ ...
    let impls: Vec<(PathBuf, usize)> = sources()
        .into_iter()
        .map(|(p, t)| (p, t.lines().filter(|l| l.starts_with("impl DataSource for ")).count()))
        .filter(|(_, n)| *n > 0)
        .collect();
    let misplaced: Vec<String> = impls
        .iter()
        .filter(|(p, n)| *n != 1 || p.parent() != Some(Path::new("src/data/source")))
        .map(|(p, n)| format!("{} ({n} sources)", p.display()))
        .collect();
    assert!(
        misplaced.is_empty(),
        "a data source is one file of src/data/source/, one per file:\n  {}",
        misplaced.join("\n  ")
    );
    // ... and every `data.dataset` name has its file, named as the spec names it.
    let names = dataset_names();
    let files: BTreeSet<String> =
        impls.iter().filter_map(|(p, _)| Some(p.file_stem()?.to_str()?.to_string())).collect();
    let missing: Vec<String> = names
        .iter()
        .map(|n| SOURCE_FAMILIES.iter().find(|(name, _)| name == n).map_or(n.as_str(), |(_, file)| file))
        .filter(|file| !files.contains(*file))
        .map(|file| format!("src/data/source/{file}.rs"))
        .collect();
    assert!(missing.is_empty(), "data.dataset names without their source file:\n  {}", missing.join("\n  "));
    assert!(names.len() >= 12 && names.contains(&"image_folder".to_string()), "{names:?}");
}

/// Each all-reduce algorithm lives in its own file, named as the plan names it, and every file
/// there is one: adding an algorithm is a file, a variant and its arms
/// (`docs/architecture.md`).
#[test]
fn each_all_reduce_algorithm_has_its_own_file() {
    let dir = Path::new("src/collective/algorithm");
    let named: BTreeSet<String> =
        trainrun::collective::Algorithm::ALL.iter().map(|a| format!("{}.rs", a.name())).collect();
    let files: BTreeSet<String> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("cannot read {}: {e}", dir.display()))
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".rs") && n != "mod.rs" && !test_file(Path::new(n)))
        .collect();
    assert_eq!(
        named, files,
        "every collective::Algorithm has a file src/collective/algorithm/<name>.rs, and every file there is an algorithm"
    );
}

/// Each metric is one file of src/metrics/ named as `train.metrics` names it, and every metric a
/// spec can name has one: adding a metric is its file and its registration
/// (`docs/architecture.md`).
#[test]
fn each_metric_is_in_its_own_file() {
    let impls: Vec<(PathBuf, usize)> = sources()
        .into_iter()
        .map(|(p, t)| (p, t.lines().filter(|l| l.starts_with("impl Metric for ")).count()))
        .filter(|(_, n)| *n > 0)
        .collect();
    let misplaced: Vec<String> = impls
        .iter()
        .filter(|(p, n)| *n != 1 || p.parent() != Some(Path::new("src/metrics")))
        .map(|(p, n)| format!("{} ({n} metrics)", p.display()))
        .collect();
    assert!(misplaced.is_empty(), "a metric is one file of src/metrics/, one per file:\n  {}", misplaced.join("\n  "));
    let files: BTreeSet<String> =
        impls.iter().filter_map(|(p, _)| Some(p.file_stem()?.to_str()?.to_string())).collect();
    let missing: Vec<String> = trainrun::metrics::ORDER
        .iter()
        .map(|m| trainrun::metrics::of(*m).name())
        .chain(["loss"])
        .filter(|name| !files.contains(*name))
        .map(|name| format!("src/metrics/{name}.rs"))
        .collect();
    assert!(missing.is_empty(), "metrics without their file:\n  {}", missing.join("\n  "));
}

/// The type a line defines: `struct`, `enum`, `trait` or `union` at any indentation, and a
/// `type` alias when it is `pub` or at column 0 (an indented private `type` is an associated
/// type of an impl or a trait).
fn defined_type(line: &str) -> Option<&str> {
    let rest = line.trim_start();
    let indented = rest.len() < line.len();
    let (public, rest) = match rest.strip_prefix("pub") {
        Some(r) if r.starts_with('(') => (true, r.split_once(')')?.1),
        Some(r) => (true, r),
        None => (false, rest),
    };
    if public && !rest.starts_with(char::is_whitespace) {
        return None;
    }
    let (keyword, rest) = rest.trim_start().split_once(char::is_whitespace)?;
    let name = rest.trim_start();
    let name = &name[..name.find(|c: char| !c.is_ascii_alphanumeric() && c != '_').unwrap_or(name.len())];
    let kind = ["struct", "enum", "trait", "union", "type"].contains(&keyword);
    let alias_in_impl = keyword == "type" && !public && indented;
    (kind && !alias_in_impl && name.starts_with(|c: char| c.is_ascii_uppercase())).then_some(name)
}

/// Every type name has one meaning across `src/`: the one a TensorFlow or Keras reader expects
/// keeps the name, the others say what they are (`docs/architecture.md`, "Glossary").
#[test]
fn no_type_name_is_defined_twice() {
    let mut defined: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for (path, text) in sources() {
        for (i, line) in text.lines().enumerate() {
            if let Some(name) = defined_type(line) {
                defined.entry(name.to_string()).or_default().push(format!("{}:{}", path.display(), i + 1));
            }
        }
    }
    let twice: Vec<String> =
        defined.iter().filter(|(_, at)| at.len() > 1).map(|(name, at)| format!("{name}: {}", at.join(", "))).collect();
    assert!(
        twice.is_empty(),
        "type names defined more than once; keep the name for the meaning TensorFlow gives it and \
         rename the others after what they are:\n  {}",
        twice.join("\n  ")
    );
    assert!(defined.len() > 300 && defined.contains_key("Layer"), "{} type names", defined.len());
}

#[test]
fn defined_type_reads_definitions_as_the_inventory_does() {
    assert_eq!(defined_type("pub struct Job {"), Some("Job"));
    assert_eq!(defined_type("    pub(crate) enum Wire {"), Some("Wire"));
    assert_eq!(defined_type("struct Recorder<'r>(&'r mut Vec<usize>);"), Some("Recorder"));
    assert_eq!(defined_type("pub trait Metric: Sync {"), Some("Metric"));
    assert_eq!(defined_type("type Failure = (u8, String);"), Some("Failure"));
    assert_eq!(defined_type("    pub type Error = String;"), Some("Error"));
    // An associated type, a comment, a lowercase name and a longer word are not definitions.
    assert_eq!(defined_type("    type Output = f32;"), None);
    assert_eq!(defined_type("/// struct Job"), None);
    assert_eq!(defined_type("struct x;"), None);
    assert_eq!(defined_type("structure Job"), None);
    assert_eq!(defined_type("public struct Job"), None);
}
