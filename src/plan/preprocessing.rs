//! `[data.preprocessing]`, resolved against the data's facts: the multiplier `rescale` means
//! for this source, the normalization checked against the channels, the crop window checked
//! against the padded image, and `validation_split` turned into a count. Every problem is a
//! diagnostic naming the key, the value and a fix; the facts returned are the ones the model
//! sees (the crop's shape, the carved splits' sizes).

use crate::data::preprocess::{Crop, FlipMode, Normalization, Normalize, NormalizeConfig};
use crate::data::{DataFacts, DataSource, Preprocessing, PreprocessingConfig, RawValues};
use crate::spec::Diagnostic;

const KEY: &str = "data.preprocessing";

/// Resolves `config` for `source` whose headers gave `facts`; returns the preprocessing and
/// the facts after it.
pub fn resolve(
    config: Option<&PreprocessingConfig>,
    source: &dyn DataSource,
    facts: &DataFacts,
    diags: &mut Vec<Diagnostic>,
) -> (Preprocessing, DataFacts) {
    let Some(c) = config else {
        return (Preprocessing::default(), facts.clone());
    };
    let name = source.name();
    if source.stream_shuffle().is_some() && c.validation_split.is_some() {
        // Carving a split off a stream would read the training records by index: a pass per
        // batch. The transforms themselves run inside the stream.
        diags.push(
            Diagnostic::error(
                format!("{KEY}.validation_split"),
                format!(
                    "validation_split is not supported with data.dataset = \"{name}\": its records are read as a stream"
                ),
            )
            .help(format!("write the validation examples to files of their own and list them in data.{name}.test")),
        );
        return (Preprocessing::default(), facts.clone());
    }
    let raw = source.raw_values();
    let mut facts = facts.clone();
    if raw == RawValues::Tokens {
        let set = [
            ("rescale", c.rescale.is_some()),
            ("normalize", c.normalize.is_some()),
            ("random_crop", c.random_crop.is_some()),
            ("random_flip", c.random_flip.is_some()),
        ];
        for (key, _) in set.iter().filter(|(_, on)| *on) {
            diags.push(
                Diagnostic::error(
                    format!("{KEY}.{key}"),
                    format!("{key} does not apply to data.dataset = \"{name}\": its examples are token ids"),
                )
                .help(format!("remove {key}; only validation_split applies to token sources")),
            );
        }
    }
    let scale = rescale(c.rescale, raw, name, diags);
    let normalize = c.normalize.as_ref().and_then(|n| normalize(n, &facts.example_shape, diags));
    let flip = c.random_flip.is_some_and(|FlipMode::Horizontal| true);
    let image = match facts.example_shape.as_slice() {
        &[h, w, _] if raw != RawValues::Tokens => Some([h, w]),
        _ => None,
    };
    if image.is_none() && raw != RawValues::Tokens {
        for (key, on) in [("random_crop", c.random_crop.is_some()), ("random_flip", flip)] {
            if on {
                diags.push(
                    Diagnostic::error(
                        format!("{KEY}.{key}"),
                        format!(
                            "{key} needs images (height, width, channels), but data.dataset = \"{name}\" gives examples shaped {:?}",
                            facts.example_shape
                        ),
                    )
                    .help(format!("remove {key}, or use an image source (image_folder, cifar10, mnist, or npy features shaped [n, height, width, channels])")),
                );
            }
        }
    }
    let crop = match (c.random_crop, image) {
        (Some(rc), Some([h, w])) => {
            let crop = Crop { padding: rc.padding, height: rc.height.unwrap_or(h), width: rc.width.unwrap_or(w) };
            let (ph, pw) = (h + 2 * crop.padding, w + 2 * crop.padding);
            if crop.height == 0 || crop.width == 0 || crop.height > ph || crop.width > pw {
                diags.push(
                    Diagnostic::error(
                        format!("{KEY}.random_crop"),
                        format!(
                            "random_crop of {} × {} does not fit the padded image: {h} × {w} with padding = {} is {ph} × {pw}",
                            crop.height, crop.width, crop.padding
                        ),
                    )
                    .help(format!("use a crop of 1 × 1 to {ph} × {pw}, or more padding")),
                );
            }
            if let Some(shape) = facts.example_shape.get_mut(..2) {
                shape.copy_from_slice(&[crop.height, crop.width]);
            }
            Some(crop)
        }
        _ => None,
    };
    let keep_for_training = c.validation_split.and_then(|v| validation(v, name, &mut facts, diags));
    (Preprocessing { scale, normalize, crop, flip: flip && image.is_some(), keep_for_training }, facts)
}

/// The multiplier on the source's values that makes raw values times `rescale`.
fn rescale(rescale: Option<f32>, raw: RawValues, name: &str, diags: &mut Vec<Diagnostic>) -> Option<f32> {
    let r = rescale?;
    let key = format!("{KEY}.rescale");
    if !r.is_finite() || r == 0.0 {
        diags.push(
            Diagnostic::error(key, format!("rescale = {r} is not a finite, non-zero factor"))
                .help("use e.g. rescale = 0.00392156862745098 (1/255)"),
        );
        return None;
    }
    let factor = match raw {
        RawValues::Bytes => r * 255.0,
        RawValues::Numbers => r,
        RawValues::Tokens => return None,
        RawValues::ArrayDtype => {
            diags.push(
                Diagnostic::error(key, format!("rescale = {r} is not applied to data.dataset = \"{name}\": only reading the arrays tells whether they are bytes (divided by 255) or numbers"))
                    .help("remove rescale and store the arrays already scaled, or use normalize"),
            );
            return None;
        }
    };
    // 1/255 for bytes is what the source already does: nothing to add, and the values keep
    // their bits.
    if factor == 1.0 || (raw == RawValues::Bytes && r == 1.0 / 255.0) { None } else { Some(factor) }
}

fn normalize(config: &NormalizeConfig, shape: &[usize], diags: &mut Vec<Diagnostic>) -> Option<Normalize> {
    let (mean, std) = match config {
        NormalizeConfig::Adapt(_) => return Some(Normalize::Adapt),
        NormalizeConfig::Given { mean, std } => (mean, std),
    };
    let channels = shape.last().copied().unwrap_or(1);
    let before = diags.len();
    for (key, values) in [("mean", mean), ("std", std)] {
        if values.len() != channels {
            diags.push(
                Diagnostic::error(
                    format!("{KEY}.normalize.{key}"),
                    format!(
                        "normalize.{key} has {} value{} but examples (shaped {shape:?}) have {channels} channel{}",
                        values.len(),
                        if values.len() == 1 { "" } else { "s" },
                        if channels == 1 { "" } else { "s" }
                    ),
                )
                .help(format!("give one {key} per channel ({channels}), or use normalize = \"adapt\"")),
            );
        }
    }
    if let Some(bad) = std.iter().find(|s| !(s.is_finite() && **s > 0.0)) {
        diags.push(
            Diagnostic::error(
                format!("{KEY}.normalize.std"),
                format!("normalize.std holds {bad}; each must be above 0"),
            )
            .help("use the channel's standard deviation, or normalize = \"adapt\""),
        );
    }
    if let Some(bad) = mean.iter().find(|m| !m.is_finite()) {
        diags.push(
            Diagnostic::error(format!("{KEY}.normalize.mean"), format!("normalize.mean holds {bad}"))
                .help("use finite means, or normalize = \"adapt\""),
        );
    }
    (diags.len() == before).then(|| Normalize::Given(Normalization { mean: mean.clone(), std: std.clone() }))
}

/// Keras' split: the last `v` of the training examples, `floor(n × (1 − v))` kept.
fn validation(v: f64, name: &str, facts: &mut DataFacts, diags: &mut Vec<Diagnostic>) -> Option<usize> {
    let key = format!("{KEY}.validation_split");
    let n = facts.train_examples;
    if facts.test_examples > 0 {
        diags.push(
            Diagnostic::error(
                key,
                format!(
                    "validation_split = {v}, but data.dataset = \"{name}\" has a test split ({} examples), which is evaluated",
                    facts.test_examples
                ),
            )
            .help("remove validation_split"),
        );
        return None;
    }
    let keep = if v > 0.0 && v < 1.0 { (n as f64 * (1.0 - v)).floor() as usize } else { 0 };
    if keep == 0 || keep >= n {
        diags.push(
            Diagnostic::error(
                key,
                format!(
                    "validation_split = {v} of {n} training examples leaves {keep} for training and {} for validation",
                    n - keep.min(n)
                ),
            )
            .help("use a fraction between 0 and 1 that leaves examples on both sides, e.g. validation_split = 0.2"),
        );
        return None;
    }
    facts.train_examples = keep;
    facts.test_examples = n - keep;
    Some(keep)
}

#[cfg(test)]
#[path = "preprocessing_tests.rs"]
mod tests;
