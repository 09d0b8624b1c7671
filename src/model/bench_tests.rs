//! Step-time measurements (ignored by default): forward + backward + SGD of zoo models on
//! random inputs, in a rayon pool of the measured thread count. Run with
//! `cargo test --release --lib model::bench -- --ignored --nocapture --test-threads 1`.

use super::build_spec;
use super::{ModelSpec, ZooModel};
use crate::engine::optimizer::Sgd;
use crate::engine::{LossFn, Optimizer, Pass, Shape, init};
use crate::vocab::LossKind;
use rand::RngExt;
use std::time::{Duration, Instant};

/// Median times of forward, backward, optimizer and the whole step over `steps` steps.
fn time_steps(zoo: ZooModel, input: &[usize], batch: usize, threads: usize, steps: usize) -> [Duration; 4] {
    let spec = ModelSpec { zoo: Some(zoo), ..ModelSpec::default() };
    let Ok(mut model) = build_spec(&spec, &Shape(input.to_vec()), 10) else {
        panic!("zoo model failed to build");
    };
    let mut r = init::rng(&[3]);
    let x: Vec<f32> = (0..batch * input.iter().product::<usize>()).map(|_| r.random_range(0.0..1.0)).collect();
    let labels: Vec<u32> = (0..batch).map(|i| (i % 10) as u32).collect();
    let loss = LossFn { kind: LossKind::SparseCategoricalCrossentropy, from_logits: true };
    let (mut params, mut state) = model.init(1);
    let mut grads = vec![0.0; params.len()];
    let mut opt = Optimizer::Sgd(Sgd::new(params.len(), 0.9, false, 0.0));
    let Ok(pool) = rayon::ThreadPoolBuilder::new().num_threads(threads).build() else {
        panic!("no thread pool");
    };
    let mut times: Vec<[Duration; 4]> = pool.install(|| {
        (0..steps + 3)
            .map(|step| {
                let pass = Pass { training: true, seed: step as u64, accumulate: false, threads };
                let t0 = Instant::now();
                model.forward(pass, &params, &mut state, &x, batch);
                let (out, g) = model.output_and_grad(batch);
                loss.evaluate(out, crate::engine::Truth::Classes(&labels), 10, 1.0 / batch as f32, Some(g));
                let t1 = Instant::now();
                model.backward(pass, &params, &mut grads, &x, batch);
                let t2 = Instant::now();
                opt.step(&mut params, &grads, 0.01);
                let t3 = Instant::now();
                [t1 - t0, t2 - t1, t3 - t2, t3 - t0]
            })
            .skip(3)
            .collect()
    });
    let mut med = [Duration::ZERO; 4];
    for (k, m) in med.iter_mut().enumerate() {
        times.sort_by_key(|t| t[k]);
        *m = times[times.len() / 2][k];
    }
    med
}

fn report(name: &str, zoo: ZooModel, input: &[usize], batch: usize, threads: usize, steps: usize) {
    let [f, b, o, s] = time_steps(zoo, input, batch, threads, steps);
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    eprintln!(
        "{name} batch {batch:>3} threads {threads}: step {:7.2} ms (fwd {:6.2}, bwd {:6.2}, sgd {:5.2}) → {:7.0} examples/s",
        ms(s),
        ms(f),
        ms(b),
        ms(o),
        batch as f64 / s.as_secs_f64()
    );
}

#[test]
#[ignore = "timing; run on an idle machine"]
fn mnist_cnn_step_time() {
    for batch in [64, 128] {
        for threads in [1, 2] {
            report("mnist_cnn", ZooModel::MnistCnn, &[28, 28], batch, threads, 30);
        }
    }
}

#[test]
#[ignore = "timing; run on an idle machine"]
fn resnet20_step_time() {
    for threads in [1, 2] {
        report("resnet20", ZooModel::Resnet20, &[32, 32, 3], 128, threads, 5);
    }
}

/// Median time of `f` over `reps` runs after one warm-up.
fn median(reps: usize, mut f: impl FnMut()) -> f64 {
    f();
    let mut t: Vec<f64> = (0..reps)
        .map(|_| {
            let t0 = Instant::now();
            f();
            t0.elapsed().as_secs_f64() * 1e3
        })
        .collect();
    t.sort_by(f64::total_cmp);
    t[reps / 2]
}

#[test]
#[ignore = "timing; run on an idle machine"]
fn mnist_cnn_breakdown() {
    use crate::engine::kernels::Window;
    use crate::engine::layers::{Conv2d, Dense};
    use crate::engine::strided::{MatMut, MatRef, gemm};
    use crate::engine::{Backward, Forward, Layer};
    use crate::vocab::Activation;
    for threads in [1, 2] {
        let Ok(pool) = rayon::ThreadPoolBuilder::new().num_threads(threads).build() else {
            panic!("no thread pool");
        };
        pool.install(|| {
            let n = 64;
            let pass = Pass {
                training: true,
                seed: 0,
                accumulate: false,
                threads,
            };
            let Some(win) = Window::new((28, 28, 1), (3, 3), (1, 1), false) else {
                panic!()
            };
            let mut conv = Conv2d::new(win, 32, Activation::Relu, true);
            let x = vec![0.5f32; n * 784];
            let cp = vec![0.01f32; 320];
            let mut cg = vec![0.0f32; 320];
            let mut cy = vec![0.0f32; n * 21632];
            let cf = median(20, || conv.forward(Forward { pass, x: &x, n }, &cp, &mut [], &mut cy));
            let dy = vec![0.01f32; n * 21632];
            let cb = median(20, || {
                conv.backward(Backward { pass, x: &x, y: &cy, dy: &dy, n }, &cp, &mut cg, None)
            });
            let mut d1 = Dense::new(21632, 128, Activation::Relu, true);
            let p1 = vec![0.001f32; 21632 * 128 + 128];
            let mut g1 = vec![0.0f32; p1.len()];
            let mut y1 = vec![0.0f32; n * 128];
            let df = median(20, || d1.forward(Forward { pass, x: &cy, n }, &p1, &mut [], &mut y1));
            let dy1 = vec![0.01f32; n * 128];
            let mut dx1 = vec![0.0f32; n * 21632];
            let db = median(20, || {
                d1.backward(Backward { pass, x: &cy, y: &y1, dy: &dy1, n }, &p1, &mut g1, Some(&mut dx1))
            });
            let mut c = vec![0.0f32; n * 128];
            let (cy_m, p1_m, dy1_m) =
                (MatRef::rows(&cy, n, 21632), MatRef::rows(&p1, 21632, 128), MatRef::rows(&dy1, n, 128));
            let gf = median(20, || gemm(MatMut::rows(&mut c, n, 128), cy_m, p1_m, false, 1.0, threads));
            let gw = median(20, || gemm(MatMut::rows(&mut g1, 21632, 128), cy_m.t(), dy1_m, false, 1.0, threads));
            let gx = median(20, || gemm(MatMut::rows(&mut dx1, n, 21632), dy1_m, p1_m.t(), false, 1.0, threads));
            let mut patches = vec![0.0f32; n * win.positions() * win.patch_len()];
            let i2c = median(20, || win.im2col(&x, n, &mut patches));
            let mut cz = vec![0.0f32; n * 21632];
            let (patches_m, cp_m, dy_m) =
                (MatRef::rows(&patches, n * 676, 9), MatRef::rows(&cp, 9, 32), MatRef::rows(&dy, n * 676, 32));
            let cgf = median(20, || gemm(MatMut::rows(&mut cz, n * 676, 32), patches_m, cp_m, false, 1.0, threads));
            let cgw = median(20, || gemm(MatMut::rows(&mut cg, 9, 32), patches_m.t(), dy_m, false, 1.0, threads));
            let relu = median(20, || {
                crate::engine::activation::backward(Activation::Relu, &cy, &dy, &mut cz, 32)
            });
            eprintln!(
                "threads {threads}: conv fwd {cf:.2} bwd {cb:.2} (im2col {i2c:.2}, gemm fwd {cgf:.2} dW {cgw:.2}, relu bwd {relu:.2}) | dense_1 fwd {df:.2} bwd {db:.2} (gemm fwd {gf:.2} dW {gw:.2} dX {gx:.2}) ms"
            );
        });
    }
}
