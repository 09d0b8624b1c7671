//! `tokens_per_s`: training tokens per second, all replicas. A throughput, not a reading of
//! sums: a language model's examples are its positions (one row of outputs and one label
//! each), so this is the loop's examples per second of the span under a name that says so,
//! and it owns no sums. There is no test-split value (evaluation is not training). Written as
//! `tokens_per_s` on lines, and in the summary as `steady_tokens_per_s`, measured as
//! `steady_examples_per_s` is.

use super::{Metric, Needs, Slot, SplitKind, Sums};

/// Tokens per second.
pub struct TokensPerS;

impl Metric for TokensPerS {
    fn name(&self) -> &'static str {
        "tokens_per_s"
    }

    fn reads(&self) -> &'static [Slot] {
        &[]
    }

    fn value(&self, split: SplitKind, _sums: &Sums, examples_per_s: f64) -> Option<f64> {
        match split {
            SplitKind::Train => Some(examples_per_s),
            SplitKind::Test => None,
        }
    }

    fn needs(&self) -> Needs {
        Needs::Sequences("counts the tokens of sequences")
    }

    fn summary_key(&self, split: SplitKind) -> String {
        match split {
            SplitKind::Train => "steady_tokens_per_s".into(),
            SplitKind::Test => "test_tokens_per_s".into(),
        }
    }
}
