//! Diagnostics: one problem in a spec, named by its key path, found by the loader or the plan.

use std::fmt;

/// How bad a problem is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Severity {
    /// The spec cannot run.
    Error,
    /// The spec runs, but probably not as meant.
    Warning,
}

/// One problem in a spec. `key` is a dotted path into the merged spec (`batch.global`,
/// `model.layers[2].units`; empty for the whole spec) so it can be traced back to the file,
/// line and column, environment variable or `--set` that gave it.
#[derive(Debug, Clone, PartialEq)]
pub struct Diagnostic {
    /// Error or warning.
    pub severity: Severity,
    /// Dotted key path the problem is about.
    pub key: String,
    /// What is wrong, with the offending numbers.
    pub message: String,
    /// How to fix it, when there is a fix to suggest.
    pub help: Option<String>,
}

impl Diagnostic {
    /// An error at `key`.
    pub fn error(key: impl Into<String>, message: impl Into<String>) -> Self {
        Self { severity: Severity::Error, key: key.into(), message: message.into(), help: None }
    }

    /// A warning at `key`.
    pub fn warning(key: impl Into<String>, message: impl Into<String>) -> Self {
        Self { severity: Severity::Warning, key: key.into(), message: message.into(), help: None }
    }

    /// Adds the fix to suggest.
    pub fn help(mut self, help: impl Into<String>) -> Self {
        self.help = Some(help.into());
        self
    }
}

impl fmt::Display for Diagnostic {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let level = match self.severity {
            Severity::Error => "error",
            Severity::Warning => "warning",
        };
        write!(f, "{level}: {}", self.message)?;
        if let Some(help) = &self.help {
            write!(f, "\n  help: {help}")?;
        }
        Ok(())
    }
}
