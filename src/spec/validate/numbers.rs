//! Numbers in validation: every float is finite (no key of a spec means anything by `nan` or
//! `inf`, and a non-finite timeout would panic in `Duration::from_secs_f64`), and every number
//! lies within its schema's bounds: `minimum`/`maximum`, their exclusive forms, and the range
//! of the integer type (`format: uint64`), compared exactly for integers.

use super::{Walker, example_of};
use crate::spec::keypath::{self, Seg};
use crate::spec::render::Finding;
use crate::spec::words::{self, show};
use figment::value::{Num, Value};
use serde_json::Value as Json;

/// One end of a range: where, whether the end itself is allowed, and how to write it.
#[derive(Debug, Clone)]
struct End {
    at: f64,
    exact: Option<i128>,
    inclusive: bool,
    text: String,
}

impl End {
    fn schema(x: f64, inclusive: bool) -> Self {
        // Bounds written in the schema are small: exact when whole.
        let exact = (x.fract() == 0.0 && x.abs() < 1e18).then_some(x as i128);
        End { at: x, exact, inclusive, text: words::bound(x) }
    }

    fn integer(i: i128) -> Self {
        End { at: i as f64, exact: Some(i), inclusive: true, text: i.to_string() }
    }

    /// Whether `n` lies beyond this end, `below` for a lower end.
    fn excludes(&self, n: &Num, below: bool) -> bool {
        let ordering = match (words::is_float(n), words::integer(n), self.exact) {
            (false, Some(i), Some(e)) => i.cmp(&e),
            _ => match words::number(n).and_then(|x| x.partial_cmp(&self.at)) {
                Some(o) => o,
                None => return false,
            },
        };
        match (below, self.inclusive) {
            (true, true) => ordering.is_lt(),
            (true, false) => ordering.is_le(),
            (false, true) => ordering.is_gt(),
            (false, false) => ordering.is_ge(),
        }
    }

    /// `at least 0`, `greater than 0`, `at most 1`, `less than 1`.
    fn words(&self, below: bool) -> String {
        match (below, self.inclusive) {
            (true, true) => format!("at least {}", self.text),
            (true, false) => format!("greater than {}", self.text),
            (false, true) => format!("at most {}", self.text),
            (false, false) => format!("less than {}", self.text),
        }
    }
}

/// The range of an integer `format` as schemars writes it.
fn format_range(format: Option<&str>) -> (Option<i128>, Option<i128>) {
    let unsigned = |max: u64| (Some(0), Some(i128::from(max)));
    let signed = |min: i64, max: i64| (Some(i128::from(min)), Some(i128::from(max)));
    match format {
        Some("uint8") => unsigned(u8::MAX.into()),
        Some("uint16") => unsigned(u16::MAX.into()),
        Some("uint32") => unsigned(u32::MAX.into()),
        Some("uint64" | "uint") => unsigned(u64::MAX),
        Some("int8") => signed(i8::MIN.into(), i8::MAX.into()),
        Some("int16") => signed(i16::MIN.into(), i16::MAX.into()),
        Some("int32") => signed(i32::MIN.into(), i32::MAX.into()),
        Some("int64" | "int") => signed(i64::MIN, i64::MAX),
        _ => (None, None),
    }
}

/// The documented range in words, for the help: `from 0 to 0.999`, `of at least 0`,
/// `greater than 0 and at most 604800`, `of at least 0 and less than 1`.
fn range_words(low: Option<&End>, high: Option<&End>) -> Option<String> {
    Some(match (low, high) {
        (Some(a), Some(b)) if a.inclusive && b.inclusive => format!("from {} to {}", a.text, b.text),
        (Some(a), Some(b)) if a.inclusive => format!("of {} and {}", a.words(true), b.words(false)),
        (Some(a), Some(b)) => format!("{} and {}", a.words(true), b.words(false)),
        (Some(a), None) if a.inclusive => format!("of {}", a.words(true)),
        (None, Some(b)) if b.inclusive => format!("of {}", b.words(false)),
        (Some(a), None) => a.words(true),
        (None, Some(b)) => b.words(false),
        (None, None) => return None,
    })
}

impl<'s> Walker<'s> {
    pub(super) fn check_range(&mut self, value: &Value, n: &Num, schema: &Json, doc: &Json, path: &[Seg]) {
        let get = |k: &str| schema.get(k).and_then(Json::as_f64);
        let low = get("exclusiveMinimum")
            .map(|x| End::schema(x, false))
            .or_else(|| get("minimum").map(|x| End::schema(x, true)));
        let high = get("exclusiveMaximum")
            .map(|x| End::schema(x, false))
            .or_else(|| get("maximum").map(|x| End::schema(x, true)));
        let key = keypath::format(path);
        let documented = range_words(low.as_ref(), high.as_ref());
        let help = |range: Option<String>| match (range, example_of(self.root, doc)) {
            (Some(r), Some(ex)) => format!("use a value {r}, e.g. {ex}"),
            (Some(r), None) => format!("use a value {r}"),
            (None, Some(ex)) => format!("use a finite number, e.g. {ex}"),
            (None, None) => "use a finite number".to_string(),
        };
        if n.to_f64().is_some_and(|x| !x.is_finite()) {
            let finding = Finding::new(&key, format!("`{key}` must be a finite number, found {}", show(value)))
                .label("not a finite number")
                .help(help(documented));
            self.findings.push(finding);
            return;
        }
        let (format_low, format_high) = format_range(schema.get("format").and_then(Json::as_str));
        let problem = if let Some(end) = low.as_ref().filter(|e| e.excludes(n, true)) {
            Some((end.words(true), if end.inclusive { "below the minimum" } else { "too small" }, documented))
        } else if let Some(end) = format_low.map(End::integer).filter(|e| e.excludes(n, true)) {
            let range = range_words(Some(&end), None);
            Some((end.words(true), "below the minimum", range))
        } else if let Some(end) = high.as_ref().filter(|e| e.excludes(n, false)) {
            Some((end.words(false), if end.inclusive { "above the maximum" } else { "too large" }, documented))
        } else if let Some(end) = format_high.map(End::integer).filter(|e| e.excludes(n, false)) {
            // A type's limit (`u32::MAX`) is named only when hit.
            let range = range_words(None, Some(&end));
            Some((end.words(false), "above the maximum", range))
        } else {
            None
        };
        let Some((bound, label, range)) = problem else {
            return;
        };
        self.findings.push(
            Finding::new(&key, format!("`{key}` must be {bound}, found {}", show(value)))
                .label(label)
                .help(help(range)),
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_read_as_a_person_writes_them() {
        let (zero, one) = (End::schema(0.0, true), End::schema(1.0, false));
        assert_eq!(range_words(Some(&zero), Some(&one)).as_deref(), Some("of at least 0 and less than 1"));
        let (above, week) = (End::schema(0.0, false), End::schema(604_800.0, true));
        assert_eq!(range_words(Some(&above), Some(&week)).as_deref(), Some("greater than 0 and at most 604800"));
        assert_eq!(range_words(Some(&zero), None).as_deref(), Some("of at least 0"));
        assert_eq!(range_words(None, None), None);
    }

    #[test]
    fn integers_compare_exactly_past_f64_precision() {
        let max = End::integer(u64::MAX.into());
        assert!(!max.excludes(&Num::U64(u64::MAX), false));
        assert!(max.excludes(&Num::U128(u128::from(u64::MAX) + 1), false));
        assert!(End::schema(1.0, true).excludes(&Num::I64(0), true));
        assert!(End::schema(0.0, false).excludes(&Num::F64(0.0), true));
        assert!(!End::schema(0.0, false).excludes(&Num::F64(1e-300), true));
    }
}
