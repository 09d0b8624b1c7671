//! `lm_head`: a language model's output layer, logits over the vocabulary at every position
//! of a `[T, dim]` input, giving `[T, vocab]`. No bias, as GPT-2's.
//!
//! Untied, it owns `kernel [dim, vocab]` (a per-position dense layer). Tied, it owns nothing
//! and computes `logits = h · Eᵀ` with the token embedding's `[vocab, dim]` table, borrowed
//! through [`Layer::tie`]: `Sequential` hands it that tensor as its parameter slice and lets
//! the embedding add its gradient on top (see `sequential.rs`). Tying is declared by weight
//! path (`embedding/embeddings`), which the model builder knows because it names the layers.

use super::positionwise_dense::PositionwiseDense;
use crate::engine::bf16::{self, ProductPath};
use crate::engine::layer::{Backward, Forward, Init, Layer, ParamSpec, Tie};
use crate::engine::shape::Shape;
use crate::engine::strided::{MatMut, MatRef};

/// Where the head's matrix comes from.
enum Weights {
    /// Its own `kernel`.
    Own(PositionwiseDense),
    /// The `[vocab, dim]` tensor at this weight path.
    Tied(String),
}

/// Logits over a vocabulary at every position.
pub struct LmHead {
    vocab: usize,
    dim: usize,
    weights: Weights,
    output: Shape,
    /// How the tied head's products run (the precision policy; an own kernel's dense layer
    /// keeps its own).
    products: ProductPath,
}

impl LmHead {
    /// A head with its own `kernel [dim, vocab]`, initialized as GPT-2's (normal, std 0.02).
    pub fn untied(seq_len: usize, dim: usize, vocab: usize) -> Self {
        let dense = PositionwiseDense::new(seq_len, dim, vocab, false).with_kernel_init(Init::Normal { std: 0.02 });
        Self {
            vocab,
            dim,
            weights: Weights::Own(dense),
            output: Shape(vec![seq_len, vocab]),
            products: ProductPath::Float32,
        }
    }

    /// A head that multiplies by the transpose of the `[vocab, dim]` tensor at `path` (an
    /// earlier `embedding` layer's `embeddings`).
    pub fn tied(seq_len: usize, dim: usize, vocab: usize, path: impl Into<String>) -> Self {
        Self {
            vocab,
            dim,
            weights: Weights::Tied(path.into()),
            output: Shape(vec![seq_len, vocab]),
            products: ProductPath::Float32,
        }
    }
}

impl Layer for LmHead {
    fn kind(&self) -> &'static str {
        "lm_head"
    }

    fn output_shape(&self) -> &Shape {
        &self.output
    }

    fn params(&self) -> Vec<ParamSpec> {
        match &self.weights {
            Weights::Own(dense) => dense.params(),
            Weights::Tied(_) => Vec::new(),
        }
    }

    fn tie(&self) -> Option<Tie> {
        match &self.weights {
            Weights::Own(_) => None,
            Weights::Tied(path) => Some(Tie { path: path.clone(), shape: vec![self.vocab, self.dim] }),
        }
    }

    fn use_products(&mut self, path: ProductPath) -> bool {
        self.products = path.for_dims(self.dim, self.vocab);
        let own = match &mut self.weights {
            Weights::Own(dense) => dense.use_products(path),
            Weights::Tied(_) => false,
        };
        own || !self.products.is_float32()
    }

    fn forward(&mut self, cx: Forward<'_>, params: &[f32], state: &mut [f32], y: &mut [f32]) {
        match &mut self.weights {
            Weights::Own(dense) => dense.forward(cx, params, state, y),
            Weights::Tied(_) => {
                let (rows, vocab, dim) = (cx.n * self.output.0[0], self.vocab, self.dim);
                let (x, table) = (MatRef::rows(cx.x, rows, dim), MatRef::rows(params, vocab, dim));
                bf16::gemm(self.products, MatMut::rows(y, rows, vocab), x, table.t(), false, 1.0, cx.pass.threads);
            }
        }
    }

    fn backward(&mut self, cx: Backward<'_>, params: &[f32], grads: &mut [f32], dx: Option<&mut [f32]>) {
        match &mut self.weights {
            Weights::Own(dense) => dense.backward(cx, params, grads, dx),
            Weights::Tied(_) => {
                let Backward { pass, x, dy, n, .. } = cx;
                let (rows, vocab, dim) = (n * self.output.0[0], self.vocab, self.dim);
                let dy = MatRef::rows(dy, rows, vocab);
                // dE [vocab, dim] = dyᵀ · h.
                bf16::gemm(
                    self.products,
                    MatMut::rows(grads, vocab, dim),
                    dy.t(),
                    MatRef::rows(x, rows, dim),
                    pass.accumulate,
                    1.0,
                    pass.threads,
                );
                if let Some(dx) = dx {
                    bf16::gemm(
                        self.products,
                        MatMut::rows(dx, rows, dim),
                        dy,
                        MatRef::rows(params, vocab, dim),
                        false,
                        1.0,
                        pass.threads,
                    );
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::layer::Pass;
    use crate::engine::layers::Embedding;
    use crate::engine::sequential::{GradSink, Sequential, SequentialError};
    use std::ops::Range;

    fn pass(accumulate: bool) -> Pass {
        Pass { training: true, seed: 1, accumulate, threads: 2 }
    }

    /// Records what backward asks of the gradient buffer.
    struct GradRecorder {
        grads: Vec<f32>,
        ready: usize,
        log: Vec<String>,
    }

    impl GradSink for GradRecorder {
        fn slice(&mut self, range: Range<usize>) -> &mut [f32] {
            assert!(range.start >= self.ready, "asked for {range:?} after marking {} ready", self.ready);
            self.log.push(format!("slice {range:?}"));
            &mut self.grads[range]
        }

        fn ready(&mut self, k: usize) {
            assert!(k >= self.ready, "ready marks go forward");
            self.ready = k;
            self.log.push(format!("ready {k}"));
        }
    }

    /// `Σ y ⊙ r` of `model` on `x`, and its gradient by backward, for `params`.
    fn loss_and_grads(model: &mut Sequential, params: &[f32], x: &[f32], r: &[f32]) -> (f64, GradRecorder) {
        let y = model.forward(pass(false), params, &mut [], x, 1);
        let loss = y.iter().zip(r).map(|(a, b)| f64::from(*a) * f64::from(*b)).sum();
        model.output_and_grad(1).1.copy_from_slice(r);
        let mut sink = GradRecorder { grads: vec![f32::NAN; params.len()], ready: 0, log: Vec::new() };
        model.backward(pass(false), params, &mut sink, x, 1);
        (loss, sink)
    }

    fn tied_model(heads: usize) -> Sequential {
        let mut layers: Vec<Box<dyn Layer>> =
            vec![Box::new(Embedding::new(4, 4, 3).with_init(Init::Normal { std: 0.5 }))];
        for _ in 0..heads {
            layers.push(Box::new(LmHead::tied(3, 4, 4, "embedding/embeddings")));
        }
        match Sequential::try_new(Shape(vec![3]), layers) {
            Ok(m) => m,
            Err(e) => panic!("{e}"),
        }
    }

    #[test]
    fn tied_heads_share_one_tensor_and_add_every_gradient() {
        // One head, and two in a row (square table): the second's backward runs first.
        for heads in [1, 2] {
            let mut model = tied_model(heads);
            assert_eq!(model.tensors().len(), 1, "the table is stored once");
            assert_eq!(model.param_len(), 16);
            let (params, _) = model.init(3);
            let x = [2.0, 0.0, 3.0];
            let r: Vec<f32> = (0..12).map(|i| ((i * 7) % 5) as f32 - 2.0).collect();
            let (_, sink) = loss_and_grads(&mut model, &params, &x, &r);
            assert_eq!(sink.ready, 16, "the table is handed off at the end");
            assert_eq!(sink.log.last().map(String::as_str), Some("ready 16"), "{:?}", sink.log);
            let h = 1e-2f32;
            for i in 0..params.len() {
                let (mut up, mut down) = (params.clone(), params.clone());
                up[i] += h;
                down[i] -= h;
                let numeric = (loss_and_grads(&mut model, &up, &x, &r).0 - loss_and_grads(&mut model, &down, &x, &r).0)
                    / (2.0 * f64::from(h));
                crate::engine::gradcheck::assert_close(f64::from(sink.grads[i]), numeric, 1e-2, &format!("dE[{i}]"));
            }
            // Accumulation adds both contributions onto what is there.
            let mut twice = sink.grads.clone();
            model.forward(pass(true), &params, &mut [], &x, 1);
            model.output_and_grad(1).1.copy_from_slice(&r);
            model.backward(pass(true), &params, &mut twice, &x, 1);
            for (a, b) in twice.iter().zip(&sink.grads) {
                assert!((a - 2.0 * b).abs() <= 1e-5 * b.abs().max(1.0), "{a} vs 2 × {b}");
            }
        }
    }

    #[test]
    fn bad_ties_are_refused_with_the_tensor_named() {
        let build = |head: LmHead| {
            let layers: Vec<Box<dyn Layer>> = vec![Box::new(Embedding::new(5, 4, 3)), Box::new(head)];
            Sequential::try_new(Shape(vec![3]), layers).err()
        };
        let Some(SequentialError::UnknownTie { path, known, .. }) = build(LmHead::tied(3, 4, 5, "embedding/kernel"))
        else {
            panic!("an unknown tensor must be refused")
        };
        assert_eq!((path.as_str(), known.as_str()), ("embedding/kernel", "embedding/embeddings"));
        let err = build(LmHead::tied(3, 4, 6, "embedding/embeddings"));
        assert!(matches!(err, Some(SequentialError::TieShape { .. })), "{err:?}");
        assert_eq!(
            err.map(|e| e.to_string()).unwrap_or_default(),
            "layer `lm_head` ties to `embedding/embeddings` of shape [5, 4], but expects [6, 4]"
        );
        // Only earlier layers lend: a head cannot borrow from a layer after it.
        let layers: Vec<Box<dyn Layer>> =
            vec![Box::new(LmHead::tied(3, 4, 4, "embedding/embeddings")), Box::new(Embedding::new(4, 4, 3))];
        assert!(matches!(Sequential::try_new(Shape(vec![3, 4]), layers), Err(SequentialError::UnknownTie { .. })));
    }
}
