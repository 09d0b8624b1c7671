//! Per-example tensor shapes (the batch dimension is kept apart).

use std::fmt;

/// The shape of one example, channels last: `[h, w, c]` for images, `[features]` for vectors.
#[derive(Debug, Clone, PartialEq, Eq, Hash, serde::Serialize)]
pub struct Shape(pub Vec<usize>);

impl Shape {
    /// Values in one example.
    pub fn numel(&self) -> usize {
        self.0.iter().product()
    }

    /// Values in one example, or `None` when the count does not fit a `usize`: sizes that
    /// come from a spec are counted with this before anything is allocated.
    pub fn checked_numel(&self) -> Option<usize> {
        self.0.iter().try_fold(1usize, |n, &d| n.checked_mul(d))
    }

    /// `(h, w, c)` when the shape is an image.
    pub fn hwc(&self) -> Option<(usize, usize, usize)> {
        match self.0.as_slice() {
            [h, w, c] => Some((*h, *w, *c)),
            _ => None,
        }
    }

    /// Number of axes.
    pub fn rank(&self) -> usize {
        self.0.len()
    }
}

impl fmt::Display for Shape {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let dims: Vec<String> = self.0.iter().map(|d| d.to_string()).collect();
        write!(f, "({})", dims.join(", "))
    }
}
