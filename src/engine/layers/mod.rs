//! One file per layer.

mod activation;
mod avg_pool2d;
mod batch_norm;
mod composite;
mod conv2d;
mod conv2d_direct;
mod dense;
mod dropout;
mod embedding;
mod gelu;
mod global_avg_pool2d;
mod kept;
mod layer_norm;
mod lent;
mod lm_head;
mod max_pool2d;
mod multi_head_attention;
mod position_embedding;
mod positionwise_dense;
mod residual;
mod transformer_block;
mod view;

pub use activation::ActivationLayer;
pub use avg_pool2d::AvgPool2d;
pub use batch_norm::BatchNorm;
pub use conv2d::{Conv2d, KernelInit};
pub use dense::Dense;
pub use dropout::Dropout;
pub use embedding::Embedding;
pub use gelu::{Gelu, GeluForm};
pub use global_avg_pool2d::GlobalAvgPool2d;
pub use layer_norm::LayerNorm;
pub use lm_head::LmHead;
pub use max_pool2d::MaxPool2d;
pub use multi_head_attention::MultiHeadAttention;
pub use position_embedding::PositionEmbedding;
pub use positionwise_dense::PositionwiseDense;
pub use residual::Residual;
pub use transformer_block::{BlockConfig, TransformerBlock};
pub use view::View;

#[cfg(test)]
mod bench;
#[cfg(test)]
mod fixtures;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::gradcheck::{check_layer, check_layer_params};
    use crate::engine::kernels::Window;
    use crate::engine::layer::{Backward, Forward, Layer, Pass};
    use crate::engine::shape::Shape;
    use crate::vocab::Activation;

    const ACTIVATIONS: [Activation; 5] =
        [Activation::Linear, Activation::Relu, Activation::Sigmoid, Activation::Tanh, Activation::Softmax];

    #[test]
    fn dense_gradients() {
        for act in ACTIVATIONS {
            check_layer(&mut Dense::new(6, 4, act, true), &Shape(vec![6]), 3, true);
        }
        check_layer(&mut Dense::new(5, 3, Activation::Linear, false), &Shape(vec![5]), 2, true);
    }

    #[test]
    fn conv2d_gradients() {
        for (same, stride, act) in
            [(false, 1, Activation::Relu), (true, 2, Activation::Tanh), (true, 1, Activation::Linear)]
        {
            let input = Shape(vec![6, 5, 2]);
            let win = Window::new((6, 5, 2), (3, 3), (stride, stride), same).unwrap();
            check_layer(&mut Conv2d::new(win, 3, act, true), &input, 3, true);
        }
    }

    #[test]
    fn activation_layer_gradients() {
        for act in ACTIVATIONS {
            check_layer(&mut ActivationLayer::new(act, Shape(vec![2, 5])), &Shape(vec![2, 5]), 3, true);
        }
    }

    #[test]
    fn view_gradients() {
        check_layer(&mut View::flatten(&Shape(vec![2, 3, 2])), &Shape(vec![2, 3, 2]), 2, true);
        check_layer(&mut View::reshape(Shape(vec![3, 4])), &Shape(vec![12]), 2, true);
    }

    fn pass(training: bool) -> Pass {
        Pass { training, seed: 1, accumulate: false, threads: 2 }
    }

    /// `layer` run forward on `x` (`n` examples) with `params` and `state`.
    fn run(layer: &mut dyn Layer, training: bool, params: &[f32], state: &mut [f32], x: &[f32], n: usize) -> Vec<f32> {
        let mut y = vec![0.0; n * layer.output_shape().numel()];
        layer.forward(Forward { pass: pass(training), x, n }, params, state, &mut y);
        y
    }

    #[test]
    fn max_pool2d_gradients() {
        for (pool, stride, same) in [(2, 2, false), (3, 2, true), (2, 1, false), (3, 3, true)] {
            let win = Window::new((5, 6, 2), (pool, pool), (stride, stride), same).unwrap();
            for training in [true, false] {
                check_layer(&mut MaxPool2d::new(win), &Shape(vec![5, 6, 2]), 3, training);
            }
        }
    }

    #[test]
    fn max_pool2d_routes_ties_to_the_first() {
        let win = Window::new((2, 2, 1), (2, 2), (2, 2), false).unwrap();
        let mut pool = MaxPool2d::new(win);
        let x = [1.0, 3.0, 3.0, 2.0];
        assert_eq!(run(&mut pool, true, &[], &mut [], &x, 1), [3.0]);
        let mut dx = [9.0; 4];
        pool.backward(Backward { pass: pass(true), x: &x, y: &[3.0], dy: &[1.0], n: 1 }, &[], &mut [], Some(&mut dx));
        assert_eq!(dx, [0.0, 1.0, 0.0, 0.0]);
    }

    #[test]
    fn max_pool2d_same_padding_ignores_the_padding() {
        // All-negative input: a zero from padding would win if padding took part.
        let win = Window::new((3, 3, 1), (2, 2), (2, 2), true).unwrap();
        let x: Vec<f32> = (1..=9).map(|v| -(v as f32)).collect();
        let y = run(&mut MaxPool2d::new(win), true, &[], &mut [], &x, 1);
        assert_eq!(y, [-1.0, -3.0, -7.0, -9.0]);
    }

    #[test]
    fn avg_pool2d_gradients() {
        for (pool, stride, same) in [(2, 2, false), (3, 2, true), (2, 1, true)] {
            let win = Window::new((5, 6, 2), (pool, pool), (stride, stride), same).unwrap();
            check_layer(&mut AvgPool2d::new(win), &Shape(vec![5, 6, 2]), 3, true);
        }
    }

    #[test]
    fn avg_pool2d_same_padding_counts_real_pixels_only() {
        // TensorFlow: avg_pool2d(1..9 as 3×3, 2, 2, SAME) = [3, 4.5, 7.5, 9].
        let win = Window::new((3, 3, 1), (2, 2), (2, 2), true).unwrap();
        let x: Vec<f32> = (1..=9).map(|v| v as f32).collect();
        let y = run(&mut AvgPool2d::new(win), true, &[], &mut [], &x, 1);
        assert_eq!(y, [3.0, 4.5, 7.5, 9.0]);
    }

    #[test]
    fn global_avg_pool2d_gradients_and_value() {
        let mut pool = GlobalAvgPool2d::new((3, 2, 2));
        check_layer(&mut pool, &Shape(vec![3, 2, 2]), 3, true);
        let x: Vec<f32> = (0..12).map(|v| v as f32).collect();
        assert_eq!(run(&mut pool, true, &[], &mut [], &x, 1), [5.0, 6.0]);
    }

    #[test]
    fn dropout_gradients() {
        for training in [true, false] {
            let mut d = Dropout::new(0.4, 2, Shape(vec![3, 4]));
            check_layer(&mut d, &Shape(vec![3, 4]), 4, training);
        }
    }

    #[test]
    fn batch_norm_gradients() {
        for (shape, training) in [(vec![3, 2, 4], true), (vec![5], true), (vec![3, 2, 4], false)] {
            let mut bn = BatchNorm::new(Shape(shape.clone()), 0.9, 1e-3);
            check_layer(&mut bn, &Shape(shape), 4, training);
        }
    }

    #[test]
    fn batch_norm_normalizes_and_moves_statistics_as_keras() {
        // Two channels; channel 0 holds 1, 2, 3, 4 (mean 2.5, biased variance 1.25).
        let mut bn = BatchNorm::new(Shape(vec![2]), 0.9, 1e-3);
        let params = [2.0, 1.0, 0.5, -1.0]; // gamma, beta
        let mut state = [0.0, 0.0, 1.0, 1.0]; // moving mean, moving variance
        let x = [1.0, 5.0, 2.0, 5.0, 3.0, 5.0, 4.0, 5.0];
        let y = run(&mut bn, true, &params, &mut state, &x, 4);
        let inv = 1.0 / (1.25f32 + 1e-3).sqrt();
        for (i, v) in [1.0f32, 2.0, 3.0, 4.0].iter().enumerate() {
            assert!((y[2 * i] - (2.0 * (v - 2.5) * inv + 0.5)).abs() < 1e-5);
            assert!((y[2 * i + 1] + 1.0).abs() < 1e-5, "a constant channel maps to beta");
        }
        let want = [0.25, 0.5, 0.9 + 0.1 * 1.25, 0.9];
        for (s, w) in state.iter().zip(want) {
            assert!((s - w).abs() < 1e-6, "{state:?}");
        }
        // Inference uses the moving statistics and leaves them alone.
        let before = state;
        let y = run(&mut bn, false, &params, &mut state, &x[..2], 1);
        assert!((y[0] - (2.0 * (1.0 - 0.25) / (1.025f32 + 1e-3).sqrt() + 0.5)).abs() < 1e-5);
        assert_eq!(state, before);
    }

    #[test]
    fn batch_norm_is_bit_identical_run_to_run() {
        let x: Vec<f32> = (0..64 * 8).map(|i| ((i * 37) % 101) as f32 * 0.1).collect();
        let params = [1.0; 16];
        let once = || {
            let mut state = [0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0];
            run(&mut BatchNorm::new(Shape(vec![8]), 0.99, 1e-3), true, &params, &mut state, &x, 64)
        };
        assert_eq!(once(), once());
    }

    #[test]
    fn residual_gradients() {
        // Identity shortcut, then a strided projection that also widens.
        for (input, filters, stride) in [((4, 4, 3), 3, 1), ((5, 4, 2), 3, 2)] {
            let (h, w, c) = input;
            for training in [true, false] {
                let mut block = Residual::new(input, filters, (stride, stride), 0.9, 1e-3).unwrap();
                check_layer(&mut block, &Shape(vec![h, w, c]), 3, training);
            }
        }
    }

    #[test]
    fn embedding_gradients() {
        let ids = [3.0, 0.0, 6.0, 3.0, 1.0, 2.0, 2.0, 5.0, 0.0, 3.0];
        let mut e = Embedding::new(7, 4, 5).with_init(crate::engine::Init::Normal { std: 0.5 });
        check_layer_params(&mut e, &ids, 2, true);
    }

    #[test]
    fn position_embedding_gradients() {
        check_layer(&mut PositionEmbedding::new(6, 4, 3).unwrap(), &Shape(vec![4, 3]), 3, true);
        assert!(PositionEmbedding::new(4, 5, 3).is_none(), "sequences longer than the block are refused");
    }

    #[test]
    fn layer_norm_gradients() {
        for eps in [1e-5, 1e-3] {
            check_layer(&mut LayerNorm::new(Shape(vec![4, 6]), eps), &Shape(vec![4, 6]), 3, true);
        }
    }

    #[test]
    fn gelu_gradients() {
        for form in [GeluForm::Exact, GeluForm::Tanh] {
            check_layer(&mut Gelu::new(form, Shape(vec![3, 5])), &Shape(vec![3, 5]), 3, true);
        }
    }

    #[test]
    fn positionwise_dense_and_untied_lm_head_gradients() {
        for bias in [true, false] {
            check_layer(&mut PositionwiseDense::new(3, 5, 4, bias), &Shape(vec![3, 5]), 2, true);
        }
        check_layer(&mut LmHead::untied(3, 5, 7), &Shape(vec![3, 5]), 2, true);
    }

    #[test]
    fn multi_head_attention_gradients() {
        let big = crate::engine::Init::Normal { std: 0.5 };
        for (causal, rate, training) in [(true, 0.0, true), (false, 0.0, true), (true, 0.3, true), (true, 0.3, false)] {
            let mut attn = MultiHeadAttention::new(5, 8, 2, causal).unwrap().with_dropout(rate, 3).with_init(big, big);
            check_layer(&mut attn, &Shape(vec![5, 8]), 2, training);
        }
        // Longer than one block of the causal tiling.
        let mut attn = MultiHeadAttention::new(21, 4, 2, true).unwrap().with_init(big, big);
        check_layer(&mut attn, &Shape(vec![21, 4]), 1, true);
        assert!(MultiHeadAttention::new(5, 8, 3, true).is_none(), "heads must divide the width");
    }

    #[test]
    fn transformer_block_gradients() {
        for (gelu, dropout) in [(GeluForm::Tanh, 0.0), (GeluForm::Exact, 0.2)] {
            let cfg = BlockConfig { seq_len: 4, dim: 8, heads: 2, hidden: 16, dropout, epsilon: 1e-5, gelu, layers: 2 };
            check_layer(&mut TransformerBlock::new(cfg, 4).unwrap(), &Shape(vec![4, 8]), 2, true);
        }
    }

    #[test]
    fn transformer_block_evaluates_as_it_trains_without_dropout() {
        // Evaluation skips what only backward needs (GELU's derivative): the same output bits.
        for gelu in [GeluForm::Exact, GeluForm::Tanh] {
            let cfg =
                BlockConfig { seq_len: 5, dim: 8, heads: 2, hidden: 32, dropout: 0.0, epsilon: 1e-5, gelu, layers: 2 };
            let mut block = TransformerBlock::new(cfg, 4).unwrap();
            let len: usize = block.params().iter().map(|p| p.len()).sum();
            let params: Vec<f32> = (0..len).map(|i| ((i * 31) % 17) as f32 / 17.0 - 0.5).collect();
            let x: Vec<f32> = (0..3 * 40).map(|i| ((i * 7) % 23) as f32 / 23.0 - 0.4).collect();
            let trained = run(&mut block, true, &params, &mut [], &x, 3);
            let evaluated = run(&mut block, false, &params, &mut [], &x, 3);
            assert!(trained.iter().any(|v| *v != 0.0));
            assert_eq!(trained, evaluated, "{gelu:?}");
        }
    }

    #[test]
    fn transformer_block_names_its_children() {
        let cfg = BlockConfig {
            seq_len: 4,
            dim: 8,
            heads: 2,
            hidden: 32,
            dropout: 0.0,
            epsilon: 1e-5,
            gelu: GeluForm::Tanh,
            layers: 4,
        };
        let block = TransformerBlock::new(cfg, 0).unwrap();
        let names: Vec<String> = block.params().into_iter().map(|p| p.name).collect();
        assert_eq!(
            names,
            [
                "ln_1/gamma",
                "ln_1/beta",
                "attention/qkv/kernel",
                "attention/qkv/bias",
                "attention/attention_output/kernel",
                "attention/attention_output/bias",
                "ln_2/gamma",
                "ln_2/beta",
                "mlp_fc/kernel",
                "mlp_fc/bias",
                "mlp_proj/kernel",
                "mlp_proj/bias"
            ]
        );
        let total: usize = block.params().iter().map(|p| p.len()).sum();
        assert_eq!(total, 12 * 8 * 8 + 13 * 8, "GPT-2's 12·d² + 13·d per block");
        let model = crate::engine::Sequential::new(Shape(vec![4, 8]), vec![Box::new(block)]);
        assert_eq!(model.tensors()[0].name, "transformer_block/ln_1/gamma");
    }

    #[test]
    fn residual_names_and_sizes_its_children() {
        let block = Residual::new((8, 8, 16), 32, (2, 2), 0.99, 1e-3).unwrap();
        let names: Vec<String> = block.params().into_iter().map(|p| p.name).collect();
        assert_eq!(
            names,
            [
                "conv_1/kernel",
                "bn_1/gamma",
                "bn_1/beta",
                "conv_2/kernel",
                "bn_2/gamma",
                "bn_2/beta",
                "shortcut_conv/kernel",
                "shortcut_bn/gamma",
                "shortcut_bn/beta"
            ]
        );
        let total: usize = block.params().iter().map(|p| p.len()).sum();
        assert_eq!(total, 3 * 3 * 16 * 32 + 3 * 3 * 32 * 32 + 32 * 16 + 3 * 2 * 32);
        assert_eq!(block.state().len(), 6);
        assert_eq!(block.output_shape(), &Shape(vec![4, 4, 32]));
        let identity = Residual::new((8, 8, 16), 16, (1, 1), 0.99, 1e-3).unwrap();
        assert_eq!(identity.params().len(), 6);
    }
}

#[cfg(test)]
mod thread_invariance {
    use crate::engine::Shape;
    use crate::engine::kernels::Window;
    use crate::engine::layer::{Backward, Forward, Layer, Pass};
    use crate::engine::layers::{BatchNorm, Conv2d};
    use crate::vocab::Activation;

    /// Forward output, parameter gradients, input gradient and state of `make()` on `threads`.
    type Results = (Vec<f32>, Vec<f32>, Vec<f32>, Vec<f32>);

    fn on_threads(make: &(dyn Fn() -> Box<dyn Layer> + Sync), input: &Shape, n: usize, threads: usize) -> Results {
        let pool = rayon::ThreadPoolBuilder::new().num_threads(threads).build().unwrap();
        pool.install(|| {
            let mut layer = make();
            let params: Vec<f32> = (0..layer.params().iter().map(|p| p.len()).sum::<usize>())
                .map(|i| ((i * 31) % 17) as f32 / 17.0 - 0.5)
                .collect();
            let mut state = vec![0.0; layer.state().iter().map(|p| p.len()).sum::<usize>()];
            let x: Vec<f32> = (0..n * input.numel()).map(|i| ((i * 7) % 23) as f32 / 23.0).collect();
            let out = n * layer.output_shape().numel();
            let (mut y, dy) =
                (vec![0.0; out], (0..out).map(|i| ((i * 13) % 29) as f32 / 29.0 - 0.5).collect::<Vec<_>>());
            let pass = Pass { training: true, seed: 1, accumulate: false, threads };
            layer.forward(Forward { pass, x: &x, n }, &params, &mut state, &mut y);
            let mut grads = vec![0.0; params.len()];
            let mut dx = vec![0.0; x.len()];
            layer.backward(Backward { pass, x: &x, y: &y, dy: &dy, n }, &params, &mut grads, Some(&mut dx));
            (y, grads, dx, state)
        })
    }

    /// Forward output and parameter gradients of `make()` on 1 and 3 threads must be equal
    /// bits; returns them.
    fn same_bits_on_any_thread_count(make: &(dyn Fn() -> Box<dyn Layer> + Sync), input: &Shape, n: usize) -> Results {
        let one = on_threads(make, input, n, 1);
        assert!(on_threads(make, input, n, 3) == one, "results differ between 1 and 3 threads");
        one
    }

    /// Under `mixed_bfloat16` a convolution wide enough for every bf16 path (patches of 576,
    /// 256 filters) takes each path this CPU has, and gives the same bits on any thread count,
    /// within bf16's rounding of float32's output and gradients and not equal to them. The
    /// one-channel 3 × 3 layer of MNIST (direct kernels) and narrow layers stay fp32.
    #[test]
    fn conv_takes_every_bf16_path_here_on_any_thread_count() {
        use crate::engine::bf16::{self, ProductPath};
        let input = Shape(vec![6, 6, 64]);
        let win = Window::new((6, 6, 64), (3, 3), (1, 1), true).unwrap();
        let layer = |path: ProductPath| {
            move || -> Box<dyn Layer> {
                // Linear: this fixture's sums are mostly negative, which a ReLU would zero.
                let mut conv = Conv2d::new(win, 256, Activation::Linear, true);
                assert_eq!(conv.use_products(path), !path.is_float32(), "{path:?} not taken");
                Box::new(conv)
            }
        };
        let fp32 = same_bits_on_any_thread_count(&layer(ProductPath::Float32), &input, 3);
        let paths = bf16::bf16_paths_to_test();
        if !paths.contains(&ProductPath::Amx) {
            eprintln!("this CPU has no AMX: its path is not tested here (the emulated one is)");
        }
        for path in paths {
            let got = same_bits_on_any_thread_count(&layer(path), &input, 3);
            for (name, a, b) in
                [("y", &got.0, &fp32.0), ("kernel and bias gradients", &got.1, &fp32.1), ("dx", &got.2, &fp32.2)]
            {
                let scale = b.iter().fold(0.0f32, |m, v| m.max(v.abs()));
                let apart = a.iter().zip(b).fold(0.0f32, |m, (p, q)| m.max((p - q).abs()));
                assert!(
                    apart > 0.0 && apart <= 1e-2 * scale,
                    "{path:?}: {name} {apart} from float32's (largest {scale})"
                );
            }
        }
        let mnist = Window::new((28, 28, 1), (3, 3), (1, 1), false).unwrap();
        assert!(!Conv2d::new(mnist, 32, Activation::Relu, true).use_products(ProductPath::Amx), "direct kernels");
        assert!(!Conv2d::new(win, 16, Activation::Relu, true).use_products(ProductPath::Amx), "16 filters");
    }

    #[test]
    fn conv_and_batch_norm_do_not_depend_on_threads() {
        let input = Shape(vec![9, 9, 3]);
        let win = Window::new((9, 9, 3), (3, 3), (1, 1), true).unwrap();
        same_bits_on_any_thread_count(&|| Box::new(Conv2d::new(win, 4, Activation::Relu, true)), &input, 13);
        same_bits_on_any_thread_count(&|| Box::new(BatchNorm::new(input.clone(), 0.99, 1e-3)), &input, 13);
    }

    #[test]
    fn transformer_layers_do_not_depend_on_threads() {
        use crate::engine::layers::{BlockConfig, GeluForm, LayerNorm, MultiHeadAttention, TransformerBlock};
        let input = Shape(vec![21, 8]);
        same_bits_on_any_thread_count(&|| Box::new(LayerNorm::new(input.clone(), 1e-5)), &input, 5);
        same_bits_on_any_thread_count(
            &|| Box::new(MultiHeadAttention::new(21, 8, 2, true).unwrap().with_dropout(0.2, 1)),
            &input,
            5,
        );
        let cfg = BlockConfig {
            seq_len: 21,
            dim: 8,
            heads: 2,
            hidden: 32,
            dropout: 0.1,
            epsilon: 1e-5,
            gelu: GeluForm::Exact,
            layers: 2,
        };
        same_bits_on_any_thread_count(&|| Box::new(TransformerBlock::new(cfg, 3).unwrap()), &input, 5);
    }
}
