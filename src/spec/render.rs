//! Rendering diagnostics as text: each one points at the file, line and column (with a caret
//! snippet), the environment variable or the `--set` its key came from, then one summary line.
//! Plain text without colors, so the output is the same everywhere and can be snapshotted.

use super::keypath;
use super::origins::{Aim, LayerKind, LocatedLayer, Origins};
use crate::diagnostic::{Diagnostic, Severity};
use annotate_snippets::{AnnotationKind, Group, Level, Origin, Renderer, Snippet};
use std::ops::Range;

/// Where a finding points.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Place {
    /// Found through the diagnostic's key path.
    Key(Aim),
    /// A known layer and, in a file, the bytes (syntax errors, `extends`, bad overrides).
    Layer { layer: usize, span: Option<Range<usize>> },
}

/// A diagnostic with what the loader knows beyond its key: where exactly to point and a short
/// label under the caret. Everything needed to act on it stays in the message and help, since
/// overrides have no snippet to put a label on.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Finding {
    pub diag: Diagnostic,
    pub place: Place,
    pub label: Option<String>,
}

impl Finding {
    /// An error at `key`, pointing at its value.
    pub fn new(key: impl Into<String>, message: impl Into<String>) -> Self {
        Self { diag: Diagnostic::error(key, message), place: Place::Key(Aim::Value), label: None }
    }

    /// Points at the key rather than the value.
    pub fn at_key(mut self) -> Self {
        self.place = Place::Key(Aim::Key);
        self
    }

    /// The text under the caret.
    pub fn label(mut self, label: impl Into<String>) -> Self {
        self.label = Some(label.into());
        self
    }

    /// The fix to suggest.
    pub fn help(mut self, help: impl Into<String>) -> Self {
        self.diag.help = Some(help.into());
        self
    }
}

/// Renders `diagnostics` of a loaded spec, each pointing where its key came from (see
/// [`Origins`]), then one summary line such as `error: 3 problems in specs/bad.toml`.
/// Works for any key path, so the planner's diagnostics render the same way as the loader's.
pub fn render(diagnostics: &[Diagnostic], origins: &Origins) -> String {
    let findings: Vec<Finding> = diagnostics
        .iter()
        .map(|diag| Finding { diag: diag.clone(), place: Place::Key(Aim::Value), label: None })
        .collect();
    render_findings(&findings, origins)
}

/// Renders findings in the order of the files they point into (the named file first), then
/// the overrides, then the summary.
pub(crate) fn render_findings(findings: &[Finding], origins: &Origins) -> String {
    let mut out = String::new();
    for part in render_parts(findings, origins) {
        out.push_str(&part);
        out.push_str("\n\n");
    }
    out.push_str(&summary(findings, origins));
    out.push('\n');
    out
}

/// Renders each of `diagnostics` on its own, in [`render`]'s order and without the summary
/// line, so a sweep can merge the problems its trials share.
pub fn render_each(diagnostics: &[Diagnostic], origins: &Origins) -> Vec<String> {
    let findings: Vec<Finding> = diagnostics
        .iter()
        .map(|diag| Finding { diag: diag.clone(), place: Place::Key(Aim::Value), label: None })
        .collect();
    render_parts(&findings, origins)
}

/// Each finding rendered, in order.
pub(crate) fn render_parts(findings: &[Finding], origins: &Origins) -> Vec<String> {
    let renderer = Renderer::plain();
    let mut placed: Vec<(&Finding, Option<LocatedLayer>)> = findings.iter().map(|f| (f, place(f, origins))).collect();
    placed.sort_by_key(|(_, at)| order(at.as_ref(), origins));
    let mut out = Vec::new();
    for (finding, at) in &placed {
        let level = match finding.diag.severity {
            Severity::Error => Level::ERROR,
            Severity::Warning => Level::WARNING,
        };
        let mut group = Group::with_title(level.primary_title(finding.diag.message.as_str()));
        if let Some(at) = at
            && let Some(layer) = origins.layers().get(at.layer)
        {
            group = match (&layer.kind, &at.span) {
                (LayerKind::File { source }, Some(span)) => group.element(
                    Snippet::source(source.as_str())
                        .path(layer.name.as_str())
                        .fold(true)
                        .annotation(AnnotationKind::Primary.span(span.clone()).label(finding.label.as_deref())),
                ),
                _ => group.element(Origin::path(layer.name.as_str())),
            };
        }
        if let Some(help) = &finding.diag.help {
            group = group.element(Level::HELP.message(help.as_str()));
        }
        out.push(renderer.render(&[group]));
    }
    out
}

fn place(finding: &Finding, origins: &Origins) -> Option<LocatedLayer> {
    match &finding.place {
        Place::Layer { layer, span } => Some(LocatedLayer { layer: *layer, span: span.clone() }),
        // No key: a problem of the environment (`MLFLOW_TRACKING_URI`), in no file.
        Place::Key(_) if finding.diag.key.is_empty() => None,
        Place::Key(aim) => {
            // A key that does not parse (a planner bug) still gets its message, at the file.
            let segs = keypath::parse(&finding.diag.key).unwrap_or_default();
            origins.locate(&segs, *aim)
        }
    }
}

/// Files from the named one down its `extends` chain, then overrides in the order given;
/// within a file, by position.
fn order(at: Option<&LocatedLayer>, origins: &Origins) -> (usize, usize, usize) {
    let Some(at) = at else {
        return (0, 0, 0);
    };
    let start = at.span.as_ref().map_or(0, |s| s.start);
    match origins.layers().get(at.layer).map(|l| &l.kind) {
        Some(LayerKind::File { .. }) => (0, usize::MAX - at.layer, start),
        _ => (1, at.layer, start),
    }
}

fn summary(findings: &[Finding], origins: &Origins) -> String {
    let errors = findings.iter().filter(|f| f.diag.severity == Severity::Error).count();
    let warnings = findings.len() - errors;
    let subject = origins.top_file().map_or_else(|| "the spec".to_string(), |i| origins.layers()[i].name.clone());
    let plural = |n: usize, word: &str| {
        if n == 1 { format!("1 {word}") } else { format!("{n} {word}s") }
    };
    match (errors, warnings) {
        (0, 0) => format!("no problems in {subject}"),
        (0, w) => format!("warning: {} in {subject}", plural(w, "warning")),
        (e, 0) => format!("error: {} in {subject}", plural(e, "problem")),
        (e, w) => format!("error: {} and {} in {subject}", plural(e, "problem"), plural(w, "warning")),
    }
}
