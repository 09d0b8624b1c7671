//! Where each value of a merged spec came from: which layer (file, environment variable,
//! `--set`) and, in a file, which bytes, so a diagnostic keyed by path can point at them.

use super::keypath::Seg;
use figment::Figment;
use figment::value::{Tag, Value};
use std::collections::HashMap;
use std::ops::Range;
use toml::Spanned;
use toml::de::{DeTable, DeValue};

/// One layer of a spec, lowest precedence first in [`Origins`].
#[derive(Debug, Clone)]
pub(crate) struct SpecLayer {
    /// How the layer is named to the user; also its figment metadata name.
    pub name: String,
    /// What the layer is.
    pub kind: LayerKind,
}

/// The kinds of layer.
#[derive(Debug, Clone)]
pub(crate) enum LayerKind {
    /// A spec file; spans are found in its text.
    File { source: String },
    /// An environment variable or `--set`, which sets one key path.
    Override { segs: Vec<Seg> },
    /// A value a sweep trial sets at `segs`, written in the spec at `at` (when a file holds
    /// the sweep), where its problems point.
    Sweep { segs: Vec<Seg>, at: Option<SweepAt> },
}

/// Where a sweep writes one trial value: in file layer `file`, its key and its value.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct SweepAt {
    pub file: usize,
    pub key: Option<Range<usize>>,
    pub value: Option<Range<usize>>,
}

/// Which part of a `key = value` line a diagnostic points at.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Aim {
    /// The key (unknown keys).
    Key,
    /// The value (wrong values), or the header of a table.
    Value,
}

/// The merged spec value of a load with the layers it came from, so that any diagnostic keyed
/// by path (the loader's or the planner's) can be traced to a file and line, an environment
/// variable or a `--set`. Rendered with [`render`](super::render).
#[derive(Debug, Clone)]
pub struct Origins {
    layers: Vec<SpecLayer>,
    merged: Value,
    tags: HashMap<Tag, usize>,
}

/// A layer, and the bytes of it to point at when it is a file.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct LocatedLayer {
    pub layer: usize,
    pub span: Option<Range<usize>>,
}

impl Origins {
    /// Layers that were never merged (the load stopped while reading files).
    pub(crate) fn unmerged(layers: Vec<SpecLayer>) -> Self {
        Self { layers, merged: Value::Dict(Tag::Default, Default::default()), tags: HashMap::new() }
    }

    /// The layers of `figment`, lowest first, and the value they merged into.
    pub(crate) fn merged(layers: Vec<SpecLayer>, merged: Value, figment: &Figment) -> Self {
        let mut tags = HashMap::new();
        let mut stack = vec![&merged];
        while let Some(value) = stack.pop() {
            let tag = value.tag();
            if let Some(meta) = figment.get_metadata(tag)
                && let Some(layer) = layers.iter().rposition(|l| l.name == meta.name)
            {
                tags.insert(tag, layer);
            }
            match value {
                Value::Dict(_, dict) => stack.extend(dict.values()),
                Value::Array(_, items) => stack.extend(items.iter()),
                _ => {}
            }
        }
        Self { layers, merged, tags }
    }

    /// The name of the layer that gave the value at `key` (a dotted path such as
    /// `model.layers[1].units`): a file path, `environment variable NAME` or `--set …` as
    /// given. A key no layer set names the nearest layer that sets its table, else the file.
    pub fn origin(&self, key: &str) -> Option<&str> {
        let segs = super::keypath::parse(key).ok()?;
        let at = self.locate(&segs, Aim::Value)?;
        self.layers.get(at.layer).map(|l| l.name.as_str())
    }

    /// The merged value of every layer.
    pub(crate) fn value(&self) -> &Value {
        &self.merged
    }

    pub(crate) fn layers(&self) -> &[SpecLayer] {
        &self.layers
    }

    /// The highest-precedence file: the one the user named.
    pub(crate) fn top_file(&self) -> Option<usize> {
        self.layers.iter().rposition(|l| matches!(l.kind, LayerKind::File { .. }))
    }

    /// Where the value at `segs` came from. A path no layer set (a missing key, a default)
    /// points at its nearest ancestor that a layer does set, else at the top file.
    pub(crate) fn locate(&self, segs: &[Seg], aim: Aim) -> Option<LocatedLayer> {
        let (depth, node) = descend(&self.merged, segs);
        if depth == segs.len()
            && depth > 0
            && !matches!(node, Value::Dict(..))
            && let Some(&layer) = self.tags.get(&node.tag())
        {
            if let Some(at) = self.in_sweep(layer, aim) {
                return Some(at);
            }
            let span = self.span_in(layer, segs, aim);
            return Some(LocatedLayer { layer, span });
        }
        // A table can come from several layers: point at the one of highest precedence that
        // writes in it. A value no layer set is derived from its table's others (the global
        // batch from `per_replica`), so the last layer to change the table is the likeliest
        // cause: a `--set batch.per_replica=…` rather than the base file's `[batch]`.
        for d in (1..=depth).rev() {
            let prefix = &segs[..d];
            let aim = if d == segs.len() { aim } else { Aim::Value };
            for (layer, l) in self.layers.iter().enumerate().rev() {
                match &l.kind {
                    LayerKind::File { .. } => {
                        if let Some(span) = self.span_in(layer, prefix, aim) {
                            return Some(LocatedLayer { layer, span: Some(span) });
                        }
                    }
                    LayerKind::Override { segs: set } | LayerKind::Sweep { segs: set, .. } => {
                        if set.starts_with(prefix) {
                            return Some(self.in_sweep(layer, aim).unwrap_or(LocatedLayer { layer, span: None }));
                        }
                    }
                }
            }
        }
        self.top_file().map(|layer| LocatedLayer { layer, span: None })
    }

    /// A sweep trial's value points at where the sweep writes it: its key for unknown keys,
    /// else its value.
    fn in_sweep(&self, layer: usize, aim: Aim) -> Option<LocatedLayer> {
        let LayerKind::Sweep { at: Some(at), .. } = &self.layers.get(layer)?.kind else {
            return None;
        };
        let span = match aim {
            Aim::Key => at.key.clone().or_else(|| at.value.clone()),
            Aim::Value => at.value.clone().or_else(|| at.key.clone()),
        };
        Some(LocatedLayer { layer: at.file, span })
    }

    fn span_in(&self, layer: usize, segs: &[Seg], aim: Aim) -> Option<Range<usize>> {
        match &self.layers.get(layer)?.kind {
            LayerKind::File { source } => {
                let (key, value) = spans(source, segs)?;
                match aim {
                    Aim::Key => key.or(Some(value)),
                    Aim::Value => Some(value),
                }
            }
            LayerKind::Override { .. } | LayerKind::Sweep { .. } => None,
        }
    }
}

/// The deepest value along `segs` in `root`, and how many segments led to it.
fn descend<'v>(root: &'v Value, segs: &[Seg]) -> (usize, &'v Value) {
    let mut node = root;
    for (depth, seg) in segs.iter().enumerate() {
        let next = match (seg, node) {
            (Seg::Key(k), Value::Dict(_, dict)) => dict.get(k),
            (Seg::Index(i), Value::Array(_, items)) => items.get(*i),
            _ => None,
        };
        match next {
            Some(value) => node = value,
            None => return (depth, node),
        }
    }
    (segs.len(), node)
}

/// The spans of the key (absent for array items) and of the value at `segs` in a TOML
/// document. A table's value span is its `[header]` (or `[[header]]` for an array item),
/// the first key of a dotted key, or its `{ … }`.
pub(crate) fn spans(source: &str, segs: &[Seg]) -> Option<(Option<Range<usize>>, Range<usize>)> {
    let (doc, _) = DeTable::parse_recoverable(source);
    let mut table: &DeTable<'_> = doc.get_ref();
    let mut found: Option<(Option<Range<usize>>, &Spanned<DeValue<'_>>)> = None;
    for seg in segs {
        let next = match seg {
            Seg::Key(k) => {
                if let Some((_, value)) = &found {
                    table = value.get_ref().as_table()?;
                }
                let (key, value) = table.get_key_value(k.as_str())?;
                (Some(key.span()), value)
            }
            Seg::Index(i) => {
                let (_, value) = found?;
                (None, value.get_ref().as_array()?.get(*i)?)
            }
        };
        found = Some(next);
    }
    let (key, value) = found?;
    Some((key, value.span()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::spec::keypath::parse;

    const DOC: &str = r#"optimizer.kind = "sgd"

[batch]
global = 64

[model]
layers = [{ type = "flatten" }]

[train]
metrics = ["accuracy", "loss"]
callback = { kind = "csv_logger", append = true }
"#;

    fn text(source: &str, path: &str) -> (Option<String>, String) {
        let Ok(segs) = parse(path) else { panic!("bad test path {path}") };
        let Some((key, value)) = spans(source, &segs) else { panic!("{path} not found") };
        (key.map(|k| source[k].to_string()), source[value].to_string())
    }

    #[test]
    fn finds_keys_and_values() {
        assert_eq!(text(DOC, "batch.global"), (Some("global".into()), "64".into()));
        assert_eq!(text(DOC, "batch"), (Some("batch".into()), "[batch]".into()));
        assert_eq!(text(DOC, "optimizer.kind"), (Some("kind".into()), "\"sgd\"".into()));
        assert_eq!(text(DOC, "optimizer").1, "optimizer");
        assert_eq!(text(DOC, "model.layers[0].type"), (Some("type".into()), "\"flatten\"".into()));
        assert_eq!(text(DOC, "model.layers[0]").1, "{ type = \"flatten\" }");
        assert_eq!(text(DOC, "train.metrics[1]"), (None, "\"loss\"".into()));
        assert_eq!(text(DOC, "train.callback.append").1, "true");
        assert!(spans(DOC, &[Seg::Key("nope".into())]).is_none());
    }

    #[test]
    fn finds_arrays_of_tables() {
        let doc = "[[model.layers]]\ntype = \"flatten\"\n\n[[model.layers]]\ntype = \"dense\"\nunits = 10\n";
        assert_eq!(text(doc, "model.layers[1]").1, "[[model.layers]]");
        let (_, span) = spans(doc, &parse("model.layers[1]").unwrap_or_default()).unwrap_or_default();
        assert_eq!(span.start, doc.rfind("[[").unwrap_or_default());
        assert_eq!(text(doc, "model.layers[1].units"), (Some("units".into()), "10".into()));
        assert_eq!(text(doc, "model").1, "model");
    }
}
