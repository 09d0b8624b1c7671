//! Key paths such as `model.layers[2].units`: how diagnostics, `--set` overrides and the
//! origin lookup name one value of a spec.

use std::fmt::Write as _;

/// One step of a key path: a table key or an array index.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Seg {
    /// A key of a table.
    Key(String),
    /// A position in an array, from 0.
    Index(usize),
}

/// Writes `segs` the way diagnostics name keys: `model.layers[2].units`; keys that are not
/// bare TOML keys are quoted (`optimizer.scaling.table."1e3"`).
pub(crate) fn format(segs: &[Seg]) -> String {
    let mut out = String::new();
    for seg in segs {
        match seg {
            Seg::Key(key) => {
                if !out.is_empty() {
                    out.push('.');
                }
                if is_bare(key) {
                    out.push_str(key);
                } else {
                    let _ = write!(out, "{key:?}");
                }
            }
            Seg::Index(i) => {
                let _ = write!(out, "[{i}]");
            }
        }
    }
    out
}

/// Whether `key` can be written without quotes in TOML.
pub(crate) fn is_bare(key: &str) -> bool {
    !key.is_empty() && key.chars().all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
}

/// Reads a key path written as [`format`] writes it. The error says what is wrong with it.
pub(crate) fn parse(text: &str) -> Result<Vec<Seg>, String> {
    let text = text.trim();
    if text.is_empty() {
        return Ok(Vec::new());
    }
    let mut segs = Vec::new();
    let mut rest = text;
    loop {
        let (key, after) = if let Some(quoted) = rest.strip_prefix('"') {
            let end = quoted
                .char_indices()
                .find(|&(_, c)| c == '"')
                .map(|(i, _)| i)
                .ok_or_else(|| format!("the quote in `{text}` is not closed"))?;
            (quoted[..end].to_string(), &quoted[end + 1..])
        } else {
            let end = rest.find(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == '-')).unwrap_or(rest.len());
            if end == 0 {
                return Err(match rest.chars().next() {
                    Some('.') | None => format!("`{text}` has an empty key between dots"),
                    Some(c) => format!("`{text}` has `{c}` where a key name should be"),
                });
            }
            (rest[..end].to_string(), &rest[end..])
        };
        segs.push(Seg::Key(key));
        rest = after;
        while let Some(inner) = rest.strip_prefix('[') {
            let end = inner.find(']').ok_or_else(|| format!("the `[` in `{text}` is not closed"))?;
            let index = inner[..end].trim().parse::<usize>().map_err(|_| {
                format!("`[{}]` in `{text}` is not an array index; write a number such as `[0]`", &inner[..end])
            })?;
            segs.push(Seg::Index(index));
            rest = &inner[end + 1..];
        }
        if rest.is_empty() {
            return Ok(segs);
        }
        rest = rest
            .strip_prefix('.')
            .ok_or_else(|| format!("`{text}` has `{}` where a `.` should be", rest.chars().next().unwrap_or('.')))?;
        if rest.is_empty() {
            return Err(format!("`{text}` ends with a `.`"));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(k: &str) -> Seg {
        Seg::Key(k.to_string())
    }

    #[test]
    fn round_trips() {
        let segs = vec![key("model"), key("layers"), Seg::Index(2), key("units")];
        assert_eq!(format(&segs), "model.layers[2].units");
        assert_eq!(parse("model.layers[2].units"), Ok(segs));
        let quoted = vec![key("table"), key("1.5")];
        assert_eq!(format(&quoted), "table.\"1.5\"");
        assert_eq!(parse("table.\"1.5\""), Ok(quoted));
        assert_eq!(parse(""), Ok(vec![]));
    }

    #[test]
    fn rejects_malformed() {
        assert!(parse("a..b").is_err());
        assert!(parse("a.").is_err());
        assert!(parse("a[x]").is_err());
        assert!(parse("a[1").is_err());
        assert!(parse("a b").is_err());
        assert!(parse("\"a").is_err());
    }
}
