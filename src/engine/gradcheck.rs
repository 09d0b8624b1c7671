//! Finite-difference gradient checks shared by every layer's tests.

use super::init;
use super::layer::{Backward, Forward, Layer, Pass};
use super::shape::Shape;
use rand::RngExt;

/// Fails unless `analytic` and `numeric` agree within `tol`, relative to their size.
pub fn assert_close(analytic: f64, numeric: f64, tol: f64, what: &str) {
    let scale = analytic.abs().max(numeric.abs()).max(5e-2);
    assert!((analytic - numeric).abs() / scale <= tol, "{what}: analytic {analytic:.6} vs numeric {numeric:.6}");
}

/// Checks `layer`'s parameter and input gradients against central differences of
/// `L = Σ y ⊙ r` for a random projection `r`, on `n` random examples of `input`.
pub fn check_layer(layer: &mut dyn Layer, input: &Shape, n: usize, training: bool) {
    check(layer, Err(n * input.numel()), n, training);
}

/// [`check_layer`] on the given input `x` (`n` examples), without the input gradient (token
/// ids have none).
pub fn check_layer_params(layer: &mut dyn Layer, x: &[f32], n: usize, training: bool) {
    check(layer, Ok(x), n, training);
}

/// The check on `x`, or on random values when `x` is `Err(len)`.
fn check(layer: &mut dyn Layer, x: Result<&[f32], usize>, n: usize, training: bool) {
    let input_grad = x.is_err();
    let pass = Pass { training, seed: 7, accumulate: false, threads: 2 };
    let mut r = init::rng(&[1]);
    let specs = layer.params();
    let mut params: Vec<f32> = Vec::new();
    for (i, p) in specs.iter().enumerate() {
        let mut t = vec![0.0; p.len()];
        init::fill(&mut t, p.init, 3, i as u64);
        // Nudge zero-initialized biases so their gradients are tested off the origin.
        t.iter_mut().for_each(|v| *v += r.random_range(-0.1..0.1));
        params.extend(t);
    }
    let state_len: usize = layer.state().iter().map(|p| p.len()).sum();
    let mut state = vec![0.0; state_len];
    let mut offset = 0;
    for p in layer.state() {
        init::fill(&mut state[offset..offset + p.len()], p.init, 3, 0);
        offset += p.len();
    }
    let x: Vec<f32> = match x {
        Ok(x) => x.to_vec(),
        Err(len) => (0..len).map(|_| r.random_range(-1.0..1.0)).collect(),
    };
    let out_len = n * layer.output_shape().numel();
    let proj: Vec<f32> = (0..out_len).map(|_| r.random_range(-1.0..1.0)).collect();

    let loss = |layer: &mut dyn Layer, params: &[f32], x: &[f32]| -> f64 {
        let mut y = vec![0.0; out_len];
        let mut st = state.clone();
        layer.forward(Forward { pass, x, n }, params, &mut st, &mut y);
        y.iter().zip(&proj).map(|(a, b)| f64::from(*a) * f64::from(*b)).sum()
    };

    let mut y = vec![0.0; out_len];
    let mut st = state.clone();
    layer.forward(Forward { pass, x: &x, n }, &params, &mut st, &mut y);
    let mut grads = vec![0.0; params.len()];
    let mut dx = vec![0.0; x.len()];
    layer.backward(
        Backward { pass, x: &x, y: &y, dy: &proj, n },
        &params,
        &mut grads,
        input_grad.then_some(&mut dx[..]),
    );

    let h = 2e-3f32;
    let name = layer.kind();
    let center = loss(layer, &params, &x);
    let (mut checked, mut kinks) = (0, 0);
    // A step that crosses a kink (relu at 0, a max-pool tie) has one-sided slopes that
    // disagree: such points are skipped, and only a few may be.
    let mut check = |analytic: f32, up: f64, down: f64, what: String| {
        let (fwd, bwd) = ((up - center) / f64::from(h), (center - down) / f64::from(h));
        if (fwd - bwd).abs() > 0.05 * fwd.abs().max(bwd.abs()).max(0.05) {
            kinks += 1;
            return;
        }
        checked += 1;
        assert_close(f64::from(analytic), (up - down) / (2.0 * f64::from(h)), 2e-2, &what);
    };
    for i in sample(params.len()) {
        let (mut up, mut down) = (params.clone(), params.clone());
        up[i] += h;
        down[i] -= h;
        let (u, d) = (loss(layer, &up, &x), loss(layer, &down, &x));
        check(grads[i], u, d, format!("{name} d/dparam[{i}]"));
    }
    for i in sample(if input_grad { x.len() } else { 0 }) {
        let (mut up, mut down) = (x.clone(), x.clone());
        up[i] += h;
        down[i] -= h;
        let (u, d) = (loss(layer, &params, &up), loss(layer, &params, &down));
        check(dx[i], u, d, format!("{name} d/dx[{i}]"));
    }
    assert!(kinks * 5 <= checked, "{name}: {kinks} of {} points sit on kinks", kinks + checked);

    // Accumulation adds onto what is there.
    let mut twice = grads.clone();
    layer.forward(Forward { pass, x: &x, n }, &params, &mut state.clone(), &mut y);
    layer.backward(
        Backward { pass: Pass { accumulate: true, ..pass }, x: &x, y: &y, dy: &proj, n },
        &params,
        &mut twice,
        None,
    );
    for (a, b) in twice.iter().zip(&grads) {
        assert_close(f64::from(*a), 2.0 * f64::from(*b), 1e-4, &format!("{name} accumulate"));
    }
    check_fused_update(layer, pass, (&params, &state), &x, &proj, (&grads, &dx), n);
}

/// The fused update ([`Layer::backward_update`]) must leave the parameters the optimizer would
/// leave from `grads` (within rounding) and the same `dx`, for plain SGD, momentum and weight
/// decay, over two steps so the velocity carries.
fn check_fused_update(
    layer: &mut dyn Layer,
    pass: Pass,
    (params, state): (&[f32], &[f32]),
    x: &[f32],
    dy: &[f32],
    (grads, dx): (&[f32], &[f32]),
    n: usize,
) {
    use super::optimizer::{Optimizer, Sgd};
    let name = layer.kind();
    let mut y = vec![0.0; n * layer.output_shape().numel()];
    for (momentum, wd) in [(0.0, 0.0), (0.9, 0.0), (0.9, 1e-2)] {
        let mut want_opt = Optimizer::Sgd(Sgd::new(params.len(), momentum, false, wd));
        let mut got_opt = want_opt.clone();
        let (mut want, mut got) = (params.to_vec(), params.to_vec());
        for round in 0..2 {
            // The gradient at the current weights, as backward would leave it.
            let mut g = grads.to_vec();
            layer.forward(Forward { pass, x, n }, &want, &mut state.to_vec(), &mut y);
            layer.backward(Backward { pass, x, y: &y, dy, n }, &want, &mut g, None);
            want_opt.step(&mut want, &g, 0.1);

            layer.forward(Forward { pass, x, n }, &got, &mut state.to_vec(), &mut y);
            let mut fused_dx = vec![0.0; x.len()];
            let mut scratch = Vec::new();
            let Some(mut step) = got_opt.fused(0.1) else { panic!("plain SGD must fuse") };
            let mut slice = step.slice(0..got.len());
            layer.backward_update(
                Backward { pass, x, y: &y, dy, n },
                &mut got,
                &mut slice,
                &mut scratch,
                Some(&mut fused_dx),
            );
            if round == 0 {
                assert_eq!(fused_dx, dx, "{name}: dx must use the weights forward used");
            }
        }
        for (i, (a, b)) in want.iter().zip(&got).enumerate() {
            assert_close(f64::from(*a), f64::from(*b), 1e-5, &format!("{name} fused update [{i}]"));
        }
    }
}

/// Up to 40 indices spread over `0..len`.
fn sample(len: usize) -> Vec<usize> {
    let step = (len / 40).max(1);
    (0..len).step_by(step).collect()
}
