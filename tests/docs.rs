//! The guide checked as code: `README.md` and every page under `docs/`.
//!
//! - **Links.** Every relative link outside code, `[x](path)`, `[x](path#anchor)` and
//!   `[x](#anchor)`, resolves: the file or folder exists, and the anchor is a heading of that
//!   Markdown file under GitHub's slug rules (the heading's text as rendered, lowercased; a space
//!   becomes `-`; every character but letters, digits, `-` and `_` is dropped; a repeated
//!   heading gets `-1`, `-2`, …). Links with a scheme (`https://…`, `mailto:`) are not followed.
//! - **Specs.** Every fenced `toml` block must parse. A block is a *complete spec* when it has a
//!   top-level `extends` key or a `[run]`, `[model]` or `[strategy]` table, unless its first line
//!   is `# fragment`: it is written into a copy of `specs/` (so `extends = "base/…"` resolves as
//!   it does for the checked-in specs) and `trainrun check` on it, offline on the real MNIST
//!   files, must exit 0. Every other block is a fragment of a spec (a `[data.csv]` table, a
//!   `[deploy]` section): each of its keys must be a key of the schema at that place, and each
//!   string a value the schema allows there, so a renamed key or value fails here too.
//! - **The front page.** `README.md` has at most 300 lines, and its table of contents ("The
//!   guide") links every page under `docs/`.
//!
//! A failure names the file, the line and what is wrong; every problem is reported at once.

mod common;

use regex_lite::Regex;
use serde_json::Value as Json;
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::LazyLock;

/// The longest the front page may be.
const README_MAX_LINES: usize = 300;

/// The heading of the front page's table of contents.
const GUIDE_HEADING: &str = "The guide";

/// A link outside code: its target and the line it is on.
struct Link {
    line: usize,
    target: String,
}

/// A fenced code block: its info string, the line of its opening fence and its text.
struct Block {
    line: usize,
    info: String,
    body: String,
}

/// What the checks read from one Markdown file.
#[derive(Default)]
struct Markdown {
    /// Each heading's text as written.
    headings: Vec<String>,
    links: Vec<Link>,
    blocks: Vec<Block>,
}

static LINK: LazyLock<Regex> = LazyLock::new(|| Regex::new(r#"\]\(([^)\s]+)(?:\s+"[^"]*")?\)"#).unwrap());
static CODE_SPAN: LazyLock<Regex> = LazyLock::new(|| Regex::new(r"`+[^`]*`+").unwrap());
static HEADING: LazyLock<Regex> = LazyLock::new(|| Regex::new(r"^ {0,3}(#{1,6})\s+(.*?)\s*#*\s*$").unwrap());
static INLINE_LINK: LazyLock<Regex> = LazyLock::new(|| Regex::new(r"!?\[([^\]]*)\]\([^)]*\)").unwrap());

/// Reads headings, links and fenced blocks, skipping what is inside code.
fn scan(text: &str) -> Markdown {
    let mut md = Markdown::default();
    let mut open: Option<(String, Block)> = None;
    for (i, line) in text.lines().enumerate() {
        let n = i + 1;
        let trimmed = line.trim_start();
        let fence: String = trimmed.chars().take_while(|&c| c == '`' || c == '~').collect();
        let is_fence = fence.len() >= 3 && fence.chars().all(|c| c == fence.chars().next().unwrap_or('`'));
        match open.take() {
            Some((marker, block))
                if is_fence && fence.starts_with(&marker) && trimmed[fence.len()..].trim().is_empty() =>
            {
                md.blocks.push(block)
            }
            Some((marker, mut block)) => {
                block.body.push_str(line);
                block.body.push('\n');
                open = Some((marker, block));
            }
            None if is_fence => {
                let info = trimmed[fence.len()..].trim().to_string();
                open = Some((fence, Block { line: n, info, body: String::new() }));
            }
            None => {
                if let Some(c) = HEADING.captures(line) {
                    md.headings.push(c[2].to_string());
                }
                let prose = CODE_SPAN.replace_all(line, "");
                for c in LINK.captures_iter(&prose) {
                    md.links.push(Link { line: n, target: c[1].to_string() });
                }
            }
        }
    }
    md
}

/// GitHub's anchor for a heading's text, before duplicates are numbered.
fn slug(heading: &str) -> String {
    let rendered = INLINE_LINK.replace_all(heading, "$1");
    rendered
        .to_lowercase()
        .chars()
        .filter_map(|c| match c {
            ' ' => Some('-'),
            '-' | '_' => Some(c),
            c if c.is_alphanumeric() => Some(c),
            _ => None,
        })
        .collect()
}

/// Every anchor of a file's headings, duplicates numbered as GitHub does.
fn anchors(md: &Markdown) -> BTreeSet<String> {
    let mut seen: BTreeMap<String, usize> = BTreeMap::new();
    let mut out = BTreeSet::new();
    for heading in &md.headings {
        let base = slug(heading);
        let count = seen.entry(base.clone()).or_insert(0);
        out.insert(if *count == 0 { base.clone() } else { format!("{base}-{count}") });
        *count += 1;
    }
    out
}

/// Problems with the links of `md`, the file at `path` (relative to the package root);
/// `read` gives another file's text, or `None` when it does not exist.
fn link_problems(path: &Path, md: &Markdown, read: &dyn Fn(&Path) -> Option<String>) -> Vec<String> {
    let mut out = Vec::new();
    for link in &md.links {
        if link.target.contains("://") || link.target.starts_with("mailto:") {
            continue;
        }
        let (file, anchor) = match link.target.split_once('#') {
            Some((f, a)) => (f, Some(a)),
            None => (link.target.as_str(), None),
        };
        let target = if file.is_empty() {
            path.to_path_buf()
        } else {
            normalize(&path.parent().unwrap_or(Path::new("")).join(file))
        };
        let at = format!("{}:{}: link `{}`", path.display(), link.line, link.target);
        let exists =
            file.is_empty() || read(&target).is_some() || Path::new(env!("CARGO_MANIFEST_DIR")).join(&target).is_dir();
        if !exists {
            out.push(format!("{at}: {} does not exist", target.display()));
            continue;
        }
        let Some(anchor) = anchor else { continue };
        if target.extension().is_none_or(|e| e != "md") {
            out.push(format!("{at}: an anchor into {}, which is not a Markdown file", target.display()));
            continue;
        }
        let headings = anchors(&scan(&read(&target).unwrap_or_default()));
        if !headings.contains(anchor) {
            let known: Vec<&str> = headings.iter().map(String::as_str).collect();
            out.push(format!(
                "{at}: no heading of {} has the anchor #{anchor} (its anchors: {})",
                target.display(),
                known.join(", ")
            ));
        }
    }
    out
}

/// `a/b/../c` → `a/c`, without touching the file system.
fn normalize(path: &Path) -> PathBuf {
    let mut out = PathBuf::new();
    for part in path.components() {
        match part {
            std::path::Component::ParentDir if out.file_name().is_some_and(|n| n != "..") => {
                out.pop();
            }
            std::path::Component::CurDir => {}
            other => out.push(other),
        }
    }
    out
}

/// Whether a `toml` block is a whole spec (see the header), and its parsed table.
fn complete_spec(block: &Block) -> Result<(bool, toml::Table), String> {
    let table: toml::Table = toml::from_str(&block.body).map_err(|e| format!("not valid TOML: {e}"))?;
    let opted_out = block.body.lines().next().is_some_and(|l| l.trim() == "# fragment");
    let whole = table.contains_key("extends")
        || ["run", "model", "strategy"].iter().any(|k| table.get(*k).is_some_and(toml::Value::is_table));
    Ok((whole && !opted_out, table))
}

/// The JSON Schema of specs, walked by key.
struct Schema(Json);

impl Schema {
    fn current() -> Schema {
        match serde_json::from_str(&trainrun::spec::schema_json()) {
            Ok(json) => Schema(json),
            Err(e) => panic!("the schema is not JSON: {e}"),
        }
    }

    /// `node` and every schema it stands for through `$ref`, `oneOf`, `anyOf` and `allOf`.
    fn alternatives<'a>(&'a self, node: &'a Json, out: &mut Vec<&'a Json>) {
        if let Some(reference) = node.get("$ref").and_then(Json::as_str) {
            let name = reference.trim_start_matches("#/$defs/");
            if let Some(def) = self.0.get("$defs").and_then(|d| d.get(name)) {
                self.alternatives(def, out);
            }
            return;
        }
        out.push(node);
        for key in ["oneOf", "anyOf", "allOf"] {
            for member in node.get(key).and_then(Json::as_array).into_iter().flatten() {
                self.alternatives(member, out);
            }
        }
    }

    /// Problems of `value` at `path` against `node`: keys the schema lacks, strings it does not
    /// allow. The value is fine when any alternative accepts it.
    fn check(&self, node: &Json, value: &toml::Value, path: &str) -> Vec<String> {
        let mut alts = Vec::new();
        self.alternatives(node, &mut alts);
        let leaves: Vec<&Json> =
            alts.iter().copied().filter(|a| !["oneOf", "anyOf", "allOf"].iter().any(|k| a.get(*k).is_some())).collect();
        if leaves.iter().any(|a| a.as_object().is_some_and(|o| o.is_empty()) || a.as_bool() == Some(true)) {
            return Vec::new();
        }
        match value {
            toml::Value::Table(table) => self.check_table(&leaves, table, path),
            toml::Value::Array(items) => {
                let schemas: Vec<&Json> = leaves.iter().filter_map(|a| a.get("items")).collect();
                if schemas.is_empty() {
                    return vec![format!("`{path}` is a list where the schema has none")];
                }
                let mut out = Vec::new();
                for (i, item) in items.iter().enumerate() {
                    out.extend(self.first_fit(&schemas, item, &format!("{path}[{i}]")));
                }
                out
            }
            scalar => match leaves.iter().any(|a| accepts(a, scalar)) {
                true => Vec::new(),
                false => {
                    vec![format!("`{path} = {scalar}` is not a value the schema allows there{}", allowed(&leaves))]
                }
            },
        }
    }

    fn check_table(&self, leaves: &[&Json], table: &toml::Table, path: &str) -> Vec<String> {
        let objects: Vec<&Json> = leaves
            .iter()
            .copied()
            .filter(|a| a.get("properties").is_some() || a.get("additionalProperties").is_some())
            .collect();
        let open = leaves.iter().any(|a| {
            a.get("type").and_then(Json::as_str) == Some("object")
                && a.get("properties").is_none()
                && a.get("additionalProperties").is_none()
        });
        if open {
            return Vec::new();
        }
        if objects.is_empty() {
            return vec![format!("`{path}` is a table where the schema has none")];
        }
        let mut out = Vec::new();
        for (key, value) in table {
            let at = if path.is_empty() { key.clone() } else { format!("{path}.{key}") };
            let schemas: Vec<&Json> = objects
                .iter()
                .filter_map(|o| {
                    o.get("properties")
                        .and_then(|p| p.get(key))
                        .or_else(|| o.get("additionalProperties").filter(|a| a.as_bool() != Some(false)))
                })
                .collect();
            if schemas.is_empty() {
                let mut keys: Vec<&str> = objects
                    .iter()
                    .filter_map(|o| o.get("properties")?.as_object())
                    .flat_map(|p| p.keys().map(String::as_str))
                    .collect();
                keys.sort_unstable();
                keys.dedup();
                out.push(format!("`{at}` is not a key of the schema (keys there: {})", keys.join(", ")));
                continue;
            }
            out.extend(self.first_fit(&schemas, value, &at));
        }
        out
    }

    /// No problems when some schema of `schemas` fits `value`, else the first one's problems.
    fn first_fit(&self, schemas: &[&Json], value: &toml::Value, path: &str) -> Vec<String> {
        let mut first = None;
        for schema in schemas {
            let problems = self.check(schema, value, path);
            if problems.is_empty() {
                return problems;
            }
            first.get_or_insert(problems);
        }
        first.unwrap_or_default()
    }
}

/// Whether a leaf schema takes this scalar: its `const` or `enum` holds it, or its `type` is
/// the scalar's (an integer fits a number).
fn accepts(schema: &Json, value: &toml::Value) -> bool {
    let as_json = match value {
        toml::Value::String(s) => Json::from(s.as_str()),
        toml::Value::Integer(i) => Json::from(*i),
        toml::Value::Float(f) => Json::from(*f),
        toml::Value::Boolean(b) => Json::from(*b),
        _ => return true,
    };
    if let Some(c) = schema.get("const") {
        return *c == as_json;
    }
    if let Some(values) = schema.get("enum").and_then(Json::as_array) {
        return values.contains(&as_json);
    }
    let kinds: &[&str] = match value {
        toml::Value::String(_) => &["string"],
        toml::Value::Integer(_) => &["integer", "number"],
        toml::Value::Float(_) => &["number"],
        _ => &["boolean"],
    };
    match schema.get("type") {
        None => schema.get("properties").is_none() && schema.get("items").is_none(),
        Some(Json::String(t)) => kinds.contains(&t.as_str()),
        Some(Json::Array(ts)) => ts.iter().any(|t| t.as_str().is_some_and(|t| kinds.contains(&t))),
        Some(_) => false,
    }
}

/// ` (one of: a, b)` when the leaves name their values.
fn allowed(leaves: &[&Json]) -> String {
    let mut names: Vec<String> = Vec::new();
    for leaf in leaves {
        names.extend(leaf.get("const").map(Json::to_string));
        names.extend(leaf.get("enum").and_then(Json::as_array).into_iter().flatten().map(Json::to_string));
    }
    if names.is_empty() { String::new() } else { format!(" (one of: {})", names.join(", ")) }
}

/// Problems with a fragment's keys and values, each located at the block.
fn fragment_problems(schema: &Schema, table: &toml::Table) -> Vec<String> {
    schema.check(&schema.0, &toml::Value::Table(table.clone()), "")
}

/// `trainrun check` on a whole spec written into `specs`, a copy of `specs/`.
fn check_problems(specs: &Path, name: &str, body: &str) -> Vec<String> {
    let path = specs.join(format!("{name}.toml"));
    if let Err(e) = std::fs::write(&path, body) {
        panic!("cannot write {}: {e}", path.display());
    }
    let out =
        common::trainrun().arg("check").arg(&path).output().unwrap_or_else(|e| panic!("cannot run trainrun: {e}"));
    match out.status.code() {
        Some(0) => Vec::new(),
        code => vec![format!("`trainrun check` exited {code:?}:\n{}", String::from_utf8_lossy(&out.stderr).trim_end())],
    }
}

/// Copies the folder `from` into `to`, recursively.
fn copy_tree(from: &Path, to: &Path) {
    let entries = std::fs::read_dir(from).unwrap_or_else(|e| panic!("cannot read {}: {e}", from.display()));
    for entry in entries.flatten() {
        let target = to.join(entry.file_name());
        if entry.path().is_dir() {
            std::fs::create_dir_all(&target).unwrap_or_else(|e| panic!("cannot create {}: {e}", target.display()));
            copy_tree(&entry.path(), &target);
        } else if let Err(e) = std::fs::copy(entry.path(), &target) {
            panic!("cannot copy {}: {e}", entry.path().display());
        }
    }
}

/// `README.md` and every Markdown file under `docs/`, relative to the package root, sorted.
fn guide_files() -> Vec<PathBuf> {
    fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
        let entries = std::fs::read_dir(dir).unwrap_or_else(|e| panic!("cannot read {}: {e}", dir.display()));
        for entry in entries.flatten() {
            let path = entry.path();
            if path.is_dir() {
                walk(&path, out);
            } else if path.extension().is_some_and(|e| e == "md") {
                out.push(path);
            }
        }
    }
    let mut out = vec![PathBuf::from("README.md")];
    walk(Path::new("docs"), &mut out);
    out[1..].sort();
    out
}

fn read_from_root(path: &Path) -> Option<String> {
    std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join(path)).ok()
}

#[test]
fn every_link_and_anchor_of_the_guide_resolves() {
    let mut problems = Vec::new();
    for path in guide_files() {
        let text = read_from_root(&path).unwrap_or_default();
        problems.extend(link_problems(&path, &scan(&text), &read_from_root));
    }
    assert!(problems.is_empty(), "{} broken links in the guide:\n{}", problems.len(), problems.join("\n"));
}

#[test]
fn every_spec_in_the_guide_passes_check_and_every_fragment_fits_the_schema() {
    let schema = Schema::current();
    let specs = common::tempdir();
    copy_tree(Path::new(env!("CARGO_MANIFEST_DIR")).join("specs").as_path(), specs.path());
    let (mut problems, mut whole) = (Vec::new(), 0);
    for path in guide_files() {
        let text = read_from_root(&path).unwrap_or_default();
        for block in scan(&text).blocks.iter().filter(|b| b.info == "toml") {
            let at = format!("{}:{}: toml block", path.display(), block.line);
            let found = match complete_spec(block) {
                Err(e) => vec![e],
                Ok((true, _)) => {
                    whole += 1;
                    let name = format!("{}_{}", path.display(), block.line).replace(['/', '.'], "_");
                    check_problems(specs.path(), &name, &block.body)
                }
                Ok((false, table)) => fragment_problems(&schema, &table),
            };
            problems.extend(found.into_iter().map(|p| format!("{at}: {p}")));
        }
    }
    assert!(problems.is_empty(), "{} problems in the guide's specs:\n{}", problems.len(), problems.join("\n\n"));
    assert!(
        whole >= 3,
        "only {whole} complete specs found in the guide: is the rule in this file's header still right?"
    );
}

#[test]
fn the_front_page_is_short_and_links_every_page_of_the_guide() {
    let text = read_from_root(Path::new("README.md")).unwrap_or_default();
    let lines = text.lines().count();
    assert!(
        lines <= README_MAX_LINES,
        "README.md has {lines} lines; the front page keeps to {README_MAX_LINES}: move the rest into docs/"
    );
    let Some((_, toc)) = text.split_once(&format!("\n## {GUIDE_HEADING}\n")) else {
        panic!("README.md has no \"## {GUIDE_HEADING}\" section, the guide's table of contents")
    };
    let toc = toc.split("\n## ").next().unwrap_or_default();
    let linked: BTreeSet<String> =
        scan(toc).links.into_iter().map(|l| l.target.split('#').next().unwrap_or_default().to_string()).collect();
    let missing: Vec<String> =
        guide_files().into_iter().skip(1).map(|p| p.display().to_string()).filter(|p| !linked.contains(p)).collect();
    assert!(missing.is_empty(), "README.md's \"{GUIDE_HEADING}\" does not link {}", missing.join(", "));
}

/// The checks above can fail: each is fed what it must refuse.
#[test]
fn the_checkers_refuse_a_broken_link_a_missing_anchor_and_a_misspelled_spec() {
    let page = "# Top\n\n## Top\n\n## Exit codes: `trainrun`\n\n[ok](#top-1) [ok](#exit-codes-trainrun) \
                [gone](nowhere.md) [no anchor](#exit-code) `[in code](nowhere.md)`\n\n```\n[in a block](nowhere.md)\n```\n";
    let read = |p: &Path| (p == Path::new("docs/page.md")).then(|| page.to_string());
    let problems = link_problems(Path::new("docs/page.md"), &scan(page), &read);
    assert_eq!(problems.len(), 2, "{problems:#?}");
    assert!(problems[0].contains("docs/page.md:7: link `nowhere.md`: docs/nowhere.md does not exist"), "{problems:#?}");
    assert!(problems[1].contains("no heading of docs/page.md has the anchor #exit-code"), "{problems:#?}");
    assert_eq!(slug("Sweeps, records & `TensorBoard` [reports](x.md)"), "sweeps-records--tensorboard-reports");

    let specs = common::tempdir();
    copy_tree(Path::new(env!("CARGO_MANIFEST_DIR")).join("specs").as_path(), specs.path());
    let typo = "extends = \"base/mnist_tutorial.toml\"\n\n[optimizer]\nlerning_rate = 0.1\n";
    let whole = scan(&format!("```toml\n{typo}```\n")).blocks.remove(0);
    assert!(matches!(complete_spec(&whole), Ok((true, _))));
    let refused = check_problems(specs.path(), "typo", &whole.body);
    assert!(refused.len() == 1 && refused[0].contains("learning_rate"), "{refused:#?}");
    let fine = check_problems(specs.path(), "fine", &typo.replace("lerning_rate", "learning_rate"));
    assert!(fine.is_empty(), "{fine:#?}");

    let schema = Schema::current();
    let fragment = |text: &str| match complete_spec(&scan(&format!("```toml\n{text}```\n")).blocks.remove(0)) {
        Ok((false, table)) => fragment_problems(&schema, &table),
        other => panic!("not a fragment: {:?}", other.map(|o| o.0)),
    };
    assert_eq!(fragment("[data]\ndataset = \"csv\"\n\n[data.csv]\nlabel = \"price\"\n"), Vec::<String>::new());
    let key = fragment("[data.csv]\nlable = \"price\"\n");
    assert!(key.len() == 1 && key[0].starts_with("`data.csv.lable` is not a key of the schema"), "{key:#?}");
    let value = fragment("[data]\ndataset = \"cvs\"\n");
    assert!(value.len() == 1 && value[0].contains("\"csv\""), "{value:#?}");
    assert!(fragment("# fragment\n[model]\nzoo = \"gpt\"\n").is_empty());
}
