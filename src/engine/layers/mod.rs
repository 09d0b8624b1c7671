//! One file per layer.

mod activation;
mod conv2d;
mod dense;
mod view;

pub use activation::ActivationLayer;
pub use conv2d::Conv2d;
pub use dense::Dense;
pub use view::View;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::gradcheck::check_layer;
    use crate::engine::kernels::Window;
    use crate::engine::shape::Shape;
    use crate::spec::Activation;

    const ACTIVATIONS: [Activation; 5] = [
        Activation::Linear,
        Activation::Relu,
        Activation::Sigmoid,
        Activation::Tanh,
        Activation::Softmax,
    ];

    #[test]
    fn dense_gradients() {
        for act in ACTIVATIONS {
            check_layer(&mut Dense::new(6, 4, act, true), &Shape(vec![6]), 3, true);
        }
        check_layer(
            &mut Dense::new(5, 3, Activation::Linear, false),
            &Shape(vec![5]),
            2,
            true,
        );
    }

    #[test]
    fn conv2d_gradients() {
        for (same, stride, act) in [
            (false, 1, Activation::Relu),
            (true, 2, Activation::Tanh),
            (true, 1, Activation::Linear),
        ] {
            let input = Shape(vec![6, 5, 2]);
            let win = Window::new((6, 5, 2), (3, 3), (stride, stride), same).unwrap();
            check_layer(&mut Conv2d::new(win, 3, act, true), &input, 3, true);
        }
    }

    #[test]
    fn activation_layer_gradients() {
        for act in ACTIVATIONS {
            check_layer(
                &mut ActivationLayer::new(act, Shape(vec![2, 5])),
                &Shape(vec![2, 5]),
                3,
                true,
            );
        }
    }

    #[test]
    fn view_gradients() {
        check_layer(
            &mut View::flatten(&Shape(vec![2, 3, 2])),
            &Shape(vec![2, 3, 2]),
            2,
            true,
        );
        check_layer(
            &mut View::reshape(Shape(vec![3, 4])),
            &Shape(vec![12]),
            2,
            true,
        );
    }
}
