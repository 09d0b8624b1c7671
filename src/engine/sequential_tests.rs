//! `Sequential`: the fused backward update against backward plus an optimizer pass.

use super::*;
use crate::engine::kernels::Window;
use crate::engine::layers::{Conv2d, Dense, View};
use crate::engine::optimizer::{Optimizer, Sgd};
use crate::engine::{LossFn, init};
use crate::vocab::{Activation, LossKind};
use rand::RngExt;

/// The tutorial model's shape, small: reshape → conv 3 × 3 relu with 4 filters → flatten →
/// dense relu of `units` → dense of 5 classes, on `side` × `side` images.
pub(crate) fn small_tutorial(side: usize, units: usize) -> Sequential {
    let (out, filters) = (side - 2, 4);
    let win = Window::new((side, side, 1), (3, 3), (1, 1), false).unwrap();
    let layers: Vec<Box<dyn Layer>> = vec![
        Box::new(View::reshape(Shape(vec![side, side, 1]))),
        Box::new(Conv2d::new(win, filters, Activation::Relu, true)),
        Box::new(View::flatten(&Shape(vec![out, out, filters]))),
        Box::new(Dense::new(out * out * filters, units, Activation::Relu, true)),
        Box::new(Dense::new(units, 5, Activation::Linear, true)),
    ];
    Sequential::new(Shape(vec![side * side]), layers)
}

fn model() -> Sequential {
    small_tutorial(8, 16)
}

/// `n` images of `side` × `side`, uniform in [0, 1); `sparse`: 97 % of the pixels 0, so that
/// most windows of the convolution see only zeros and its ReLU output is mostly 0, which
/// sends the dense layer above it down the sparse path ([`crate::engine::sparse`]).
fn images(r: &mut impl rand::Rng, n: usize, side: usize, sparse: bool) -> Vec<f32> {
    (0..n * side * side)
        .map(|_| if sparse && r.random_range(0.0..1.0) < 0.97 { 0.0 } else { r.random_range(0.0..1.0) })
        .collect()
}

/// Asserts that the convolution's ReLU output of the last forward (`n` examples) is sparse
/// enough for the dense layer above to walk only its nonzeros, or dense enough for gemm.
fn assert_conv_output_is(m: &Sequential, n: usize, sparse: bool) {
    let out = &m.acts[0][..n * m.layers[1].output_shape().numel()];
    let walked = crate::engine::sparse::backward_pays(crate::engine::sparse::count_nonzeros(out), out.len());
    assert_eq!(walked, sparse, "the convolution's output density");
}

/// Three steps of backward + optimizer pass against three of `backward_update`.
#[test]
fn fused_update_equals_the_unfused_one_within_rounding() {
    for sparse in [false, true] {
        fused_update_matches(sparse);
    }
}

/// [`fused_update_equals_the_unfused_one_within_rounding`] on dense or mostly-zero images.
fn fused_update_matches(sparse: bool) {
    let n = 6;
    let mut r = init::rng(&[3]);
    let x = images(&mut r, n, 8, sparse);
    let labels: Vec<u32> = (0..n).map(|_| r.random_range(0..5)).collect();
    let loss = LossFn { kind: LossKind::SparseCategoricalCrossentropy, from_logits: true };
    for (momentum, wd) in [(0.0, 0.0), (0.9, 0.0), (0.9, 1e-3)] {
        let (mut a, mut b) = (model(), model());
        let (init, _) = a.init(5);
        let (mut pa, mut pb) = (init.clone(), init);
        let mut oa = Optimizer::Sgd(Sgd::new(pa.len(), momentum, false, wd));
        let mut ob = oa.clone();
        let mut grads = vec![0.0; pa.len()];
        for step in 0..3 {
            let pass = Pass { training: true, seed: step, accumulate: false, threads: 2 };
            a.forward(pass, &pa, &mut [], &x, n);
            if step == 0 {
                // Later steps move the convolution's biases, and with them its zeros.
                assert_conv_output_is(&a, n, sparse);
            }
            let (out, dout) = a.output_and_grad(n);
            loss.evaluate(out, crate::engine::Truth::Classes(&labels), 5, 1.0 / n as f32, Some(dout));
            a.backward(pass, &pa, &mut grads, &x, n);
            oa.step(&mut pa, &grads, 0.05);

            b.forward(pass, &pb, &mut [], &x, n);
            let (out, dout) = b.output_and_grad(n);
            loss.evaluate(out, crate::engine::Truth::Classes(&labels), 5, 1.0 / n as f32, Some(dout));
            let Some(mut fused) = ob.fused(0.05) else { panic!("SGD must fuse") };
            b.backward_update(pass, &mut pb, &mut fused, &x, n);
        }
        let worst = pa.iter().zip(&pb).map(|(p, q)| (p - q).abs()).fold(0.0, f32::max);
        assert!(worst < 1e-5, "sparse {sparse}, momentum {momentum}, weight decay {wd}: off by {worst}");
        assert_ne!(pa, init_of(&a), "training moved the weights");
        assert_eq!(oa.state().len(), ob.state().len());
        if let (Some((_, va)), Some((_, vb))) = (oa.state().first(), ob.state().first()) {
            let worst = va.iter().zip(*vb).map(|(p, q)| (p - q).abs()).fold(0.0, f32::max);
            assert!(worst < 1e-5, "velocity off by {worst}");
        }
        assert_eq!(oa.iterations(), ob.iterations());
    }
}

fn init_of(m: &Sequential) -> Vec<f32> {
    m.init(5).0
}

/// reshape → conv relu → flatten → dense relu (576 × 128: three row blocks, the last short)
/// → dense: the big dense layer is where replicas meet. Its products have the tutorial's
/// width and depth (128 units, 64 examples a replica), so gemm takes the same paths.
fn meeting_model() -> Sequential {
    small_tutorial(14, 128)
}

/// Forward and loss of examples `rows` of `x` (196 values each) with their `labels`.
fn forward_loss(m: &mut Sequential, pass: Pass, params: &[f32], x: &[f32], labels: &[u32], rows: Range<usize>) {
    let loss = LossFn { kind: LossKind::SparseCategoricalCrossentropy, from_logits: true };
    m.forward(pass, params, &mut [], &x[rows.start * 196..rows.end * 196], rows.len());
    let (out, dout) = m.output_and_grad(rows.len());
    loss.evaluate(out, crate::engine::Truth::Classes(&labels[rows]), 5, 1.0 / 128.0, Some(dout));
}

/// Two replicas meeting at the big dense layer (`meet`, `update_kernel`, `backward_rest`)
/// end each step with the bits of two whole backward passes and the optimizer pass over
/// their summed gradients, on any number of threads; a walk paused there and finished
/// without meeting writes the bits of a whole backward.
#[test]
fn replicas_meeting_inside_backward_give_the_summed_update_bits() {
    for sparse in [false, true] {
        replicas_meeting_match(sparse);
    }
}

/// [`replicas_meeting_inside_backward_give_the_summed_update_bits`] on dense or mostly-zero
/// images.
fn replicas_meeting_match(sparse: bool) {
    use crate::engine::meet::update_kernel;
    let mut r = init::rng(&[4]);
    let x = images(&mut r, 128, 14, sparse);
    let labels: Vec<u32> = (0..128).map(|_| r.random_range(0..5)).collect();
    let parts = [0..64, 64..128];
    let pass = Pass { training: true, seed: 0, accumulate: false, threads: 1 };
    let (init, _) = meeting_model().init(5);
    let kernel = meeting_model().meeting_kernel().unwrap();
    assert_eq!(kernel.len(), 576 * 128, "the big dense kernel is the meeting layer's");
    for momentum in [0.0, 0.9] {
        let mut want = init.clone();
        let mut opt_want = Optimizer::Sgd(Sgd::new(init.len(), momentum, false, 0.0));
        let mut models = [meeting_model(), meeting_model()];
        let mut grads = vec![vec![0.0; init.len()]; 2];
        for _ in 0..2 {
            for ((m, g), rows) in models.iter_mut().zip(&mut grads).zip(parts.clone()) {
                forward_loss(m, pass, &want, &x, &labels, rows.clone());
                m.backward(pass, &want, g, &x[rows.start * 196..rows.end * 196], rows.len());
            }
            opt_want.step_sum(&mut want, &[&grads[0], &grads[1]], 0.05);
        }
        for threads in [1, 2, 3] {
            let mut got = init.clone();
            let mut opt = Optimizer::Sgd(Sgd::new(init.len(), momentum, false, 0.0));
            let mut models = [meeting_model(), meeting_model()];
            let mut grads = vec![vec![0.0; init.len()]; 2];
            let mut scratch = Vec::new();
            for _ in 0..2 {
                for ((m, g), rows) in models.iter_mut().zip(&mut grads).zip(parts.clone()) {
                    forward_loss(m, pass, &got, &x, &labels, rows.clone());
                    assert!(m.backward_above(pass, &got, g, &x[rows.start * 196..rows.end * 196], rows.len()));
                    assert!(m.at_meeting());
                }
                let mut step = opt.fused(0.05).unwrap();
                let mut meetings: Vec<_> = models
                    .iter_mut()
                    .zip(&mut grads)
                    .zip(parts.clone())
                    .map(|((m, g), rows)| m.meet(pass, g, &x[rows.start * 196..rows.end * 196], rows.len()).unwrap())
                    .collect();
                update_kernel(
                    &mut got[kernel.clone()],
                    &mut step.slice(kernel.clone()),
                    &mut meetings,
                    threads,
                    &mut scratch,
                );
                drop(meetings);
                for ((m, g), rows) in models.iter_mut().zip(&mut grads).zip(parts.clone()) {
                    assert!(m.backward_rest(pass, &got, g, &x[rows.start * 196..rows.end * 196], rows.len()));
                }
                for range in [0..kernel.start, kernel.end..init.len()] {
                    let sums = [&grads[0][range.clone()], &grads[1][range.clone()]];
                    step.slice(range.clone()).apply_sum(&mut got[range], &sums);
                }
            }
            let worst =
                |r: Range<usize>| got[r.clone()].iter().zip(&want[r]).map(|(a, b)| (a - b).abs()).fold(0.0, f32::max);
            let (k, rest) = (worst(kernel.clone()), worst(0..kernel.start).max(worst(kernel.end..init.len())));
            assert!(
                got == want,
                "sparse {sparse}, momentum {momentum}, {threads} threads: not the summed update's bits ({k} off in the kernel, {rest} elsewhere)"
            );
            assert_ne!(got, init, "training moved the weights");
            assert!(opt.state() == opt_want.state(), "momentum {momentum}, {threads} threads: the velocity differs");
            assert_eq!(opt.iterations(), 2);
        }
        // Paused at the meeting layer and finished alone: a whole backward's gradient.
        let (mut a, mut b) = (meeting_model(), meeting_model());
        let (mut ga, mut gb) = (vec![0.0; init.len()], vec![0.0; init.len()]);
        forward_loss(&mut a, pass, &init, &x, &labels, 0..128);
        assert_conv_output_is(&a, 128, sparse);
        a.backward(pass, &init, &mut ga, &x, 128);
        forward_loss(&mut b, pass, &init, &x, &labels, 0..128);
        assert!(b.backward_above(pass, &init, &mut gb, &x, 128));
        assert!(b.backward_rest(pass, &init, &mut gb, &x, 128));
        assert!(ga == gb, "a paused walk changed the gradient");
        assert!(!b.backward_rest(pass, &init, &mut gb, &x, 128), "nothing was left to finish");
    }
}

/// `trainrun predict` runs the model in inference mode: for a model without dropout or batch
/// normalization that must be the training forward's output bit for bit, on dense and on
/// mostly-zero images (the dense layer's gemm and its sparse walk), on one thread and two.
#[test]
fn inference_forward_is_the_training_forward_bit_for_bit() {
    let mut m = small_tutorial(12, 16);
    let (params, mut state) = m.init(5);
    let mut r = init::rng(&[11]);
    for (sparse, n, threads) in [(false, 1, 1), (false, 33, 2), (true, 7, 1), (true, 33, 2)] {
        let x = images(&mut r, n, 12, sparse);
        let at = |training| Pass { training, seed: 9, accumulate: false, threads };
        let trained = m.forward(at(true), &params, &mut state, &x, n).to_vec();
        assert_conv_output_is(&m, n, sparse);
        let inferred = m.forward(at(false), &params, &mut state, &x, n);
        let bits = |v: &[f32]| v.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(inferred), bits(&trained), "sparse {sparse}, {n} examples, {threads} threads");
    }
}
