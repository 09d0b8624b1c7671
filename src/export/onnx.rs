//! A built model as an ONNX graph (opset [`OPSET`], IR version [`IR_VERSION`]), from the
//! engine's own description of each layer ([`Op`]) and the trained values, written with the
//! prost types of the vendored `proto/onnx/onnx.proto`.
//!
//! The graph reads what trainrun's model reads: input `input`, float32 `[batch, *example
//! shape]` in trainrun's (Keras's) channels-last layout, e.g. `[batch, 28, 28, 1]` for MNIST, and
//! writes `output`, float32 `[batch, *output shape]`, the model's raw outputs (logits, or
//! probabilities when it ends in softmax). ONNX's convolutions and pools are channels-first,
//! so the graph transposes to NCHW before the first of them and back to channels-last before
//! anything that reads the Keras layout (flatten, reshape, dense, the output): the values and
//! the flatten order are trainrun's.
//!
//! Covered: dense, conv2d, max_pool2d, avg_pool2d (dividing by the real pixels under a `same`
//! window, as TensorFlow does), global_avg_pool2d, batch_norm (inference form, moving
//! statistics), flatten, reshape, activation, dropout (the identity) and the ResNet residual
//! block. Any other layer is refused, naming it. The GPT is written whole by `gpt.rs` (opset
//! [`GPT_OPSET`], for LayerNormalization), from its tensors by name.

use crate::engine::Sequential;
use crate::engine::kernels::Window;
use crate::engine::op::{BatchNormOp, ConvOp, Op, ResidualOp};
use crate::model::{LayerConfig, Padding};
use crate::vocab::Activation;
use prost::Message;

mod gpt;

pub use gpt::{GPT_IR_VERSION, GPT_OPSET, export_gpt};

mod proto {
    #![allow(clippy::all, missing_docs)]
    tonic::include_proto!("onnx");
}

use proto::{
    AttributeProto, GraphProto, ModelProto, NodeProto, OperatorSetIdProto, TensorProto, TensorShapeProto, TypeProto,
    ValueInfoProto, attribute_proto::AttributeType, tensor_proto::DataType, tensor_shape_proto, type_proto,
};

/// The operator set the graph uses (every operator here exists in it unchanged since 13 or
/// earlier, so ONNX Runtime from 1.10 on runs it).
pub const OPSET: i64 = 13;
/// The IR version that opset 13 goes with.
pub const IR_VERSION: i64 = 7;

/// Why a model has no ONNX form.
#[derive(Debug, thiserror::Error)]
pub enum OnnxError {
    #[error(
        "layer `{name}` ({kind}) has no ONNX form in this version (exported: dense, conv2d, max_pool2d, \
         avg_pool2d, global_avg_pool2d, batch_norm, flatten, reshape, activation, dropout, residual, and the GPT \
         as a whole)"
    )]
    Unsupported { name: String, kind: &'static str },
    /// The GPT lacks a tensor its graph reads (the plan and the layout disagree: a bug).
    #[error("the GPT has no tensor `{0}`, which its ONNX graph reads")]
    MissingTensor(String),
}

/// Where the running value is and in which layout.
struct GraphValue {
    name: String,
    /// The value is channels-first (`[batch, c, h, w]`), for convolutions and pools.
    nchw: bool,
    /// Shape of one example in trainrun's layout.
    shape: Vec<usize>,
}

/// Builds the graph node by node.
struct Graph<'a> {
    params: &'a [f32],
    state: &'a [f32],
    nodes: Vec<NodeProto>,
    initializers: Vec<TensorProto>,
    counter: usize,
}

/// The ONNX model of `model` with `params` and `state`, serialized.
/// `layers` are the planned layers `model` was built from, one per layer (for what the engine
/// does not describe, the average pool's window).
pub fn export(
    model: &Sequential,
    layers: &[LayerConfig],
    params: &[f32],
    state: &[f32],
    doc: &str,
) -> Result<Vec<u8>, OnnxError> {
    let mut g = Graph::new(params, state);
    let input = model.input_shape().0.clone();
    let mut at = GraphValue { name: "input".into(), nchw: false, shape: input.clone() };
    for (view, config) in model.layer_views().into_iter().zip(layers) {
        let name = view.name.to_string();
        let out_shape = view.output_shape.0.clone();
        match (view.op, view.kind) {
            (_, "dropout") => {}
            (Some(Op::View), _) => {
                g.channels_last(&mut at);
                let mut shape = vec![-1i64];
                shape.extend(out_shape.iter().map(|&d| d as i64));
                let s = g.constant_i64(&format!("{name}/shape"), &shape);
                at.name = g.node("Reshape", &name, &[&at.name, &s], vec![]);
            }
            (Some(Op::Dense { inputs, units, activation, kernel, bias }), _) => {
                g.channels_last(&mut at);
                if at.shape.len() != 1 {
                    at.name = g.node("Flatten", &format!("{name}/flatten"), &[&at.name], vec![int("axis", 1)]);
                }
                let w = g.weight(&format!("{name}/kernel"), kernel, &[inputs, units]);
                let mut y = g.node("MatMul", &name, &[&at.name, &w], vec![]);
                if let Some(b) = bias {
                    let b = g.weight(&format!("{name}/bias"), b, &[units]);
                    y = g.node("Add", &format!("{name}/bias_add"), &[&y, &b], vec![]);
                }
                at.name = g.activation(&name, activation, &y);
            }
            (Some(Op::Conv2d(c)), _) => {
                g.channels_first(&mut at);
                at.name = g.conv(&name, &at.name, &c);
            }
            (Some(Op::MaxPool2d(w)), _) => {
                g.channels_first(&mut at);
                let attrs = vec![ints("kernel_shape", &[w.kh, w.kw]), ints("strides", &[w.sh, w.sw]), pads(&w)];
                at.name = g.node("MaxPool", &name, &[&at.name], attrs);
            }
            (Some(Op::GlobalAvgPool2d { .. }), _) => {
                g.channels_first(&mut at);
                let pooled = g.node("GlobalAveragePool", &name, &[&at.name], vec![]);
                at.name = g.node("Flatten", &format!("{name}/flatten"), &[&pooled], vec![int("axis", 1)]);
                at.nchw = false;
            }
            (Some(Op::BatchNorm(_)), kind) if at.shape.len() == 2 => {
                // ONNX normalizes axis 1, which for a [batch, T, c] value is not the channels.
                return Err(OnnxError::Unsupported { name, kind });
            }
            (Some(Op::BatchNorm(b)), _) => {
                // ONNX normalizes axis 1: the channels of NCHW, or the features of [batch, c].
                if at.shape.len() == 3 {
                    g.channels_first(&mut at);
                }
                at.name = g.batch_norm(&name, &at.name, &b);
            }
            (Some(Op::Activation(a)), _) => {
                // Softmax and the others act on the last axis of trainrun's layout.
                if a == Activation::Softmax {
                    g.channels_last(&mut at);
                }
                at.name = g.activation(&name, a, &at.name);
            }
            (Some(Op::Residual(r)), _) => {
                g.channels_first(&mut at);
                at.name = g.residual(&name, &at.name, &r);
            }
            (None, kind) => {
                let LayerConfig::AvgPool2d { pool_size, strides, padding } = config else {
                    return Err(OnnxError::Unsupported { name, kind });
                };
                let &[h, w, c] = view.input_shape.0.as_slice() else {
                    return Err(OnnxError::Unsupported { name, kind });
                };
                let same = matches!(padding, Padding::Same);
                let Some(win) = Window::new((h, w, c), pool_size.hw(), strides.unwrap_or(*pool_size).hw(), same) else {
                    return Err(OnnxError::Unsupported { name, kind });
                };
                g.channels_first(&mut at);
                // count_include_pad = 0: TensorFlow divides by the real pixels under the window.
                let attrs =
                    vec![ints("kernel_shape", &[win.kh, win.kw]), ints("strides", &[win.sh, win.sw]), pads(&win)];
                at.name = g.node("AveragePool", &name, &[&at.name], attrs);
            }
        }
        at.shape = out_shape;
    }
    g.channels_last(&mut at);
    let out = g.node("Identity", "output", &[&at.name], vec![]);
    let io = (value_info("input", DataType::Float, &input), value_info(&out, DataType::Float, &model.output_shape().0));
    Ok(g.finish(io, doc, (OPSET, IR_VERSION)))
}

impl<'a> Graph<'a> {
    fn new(params: &'a [f32], state: &'a [f32]) -> Self {
        Graph { params, state, nodes: Vec::new(), initializers: Vec::new(), counter: 0 }
    }

    /// The serialized model of the nodes added, reading `input` and writing `output`.
    fn finish(self, (input, output): (ValueInfoProto, ValueInfoProto), doc: &str, (opset, ir): (i64, i64)) -> Vec<u8> {
        let graph = GraphProto {
            node: self.nodes,
            name: Some("trainrun".into()),
            initializer: self.initializers,
            doc_string: Some(doc.into()),
            input: vec![input],
            output: vec![output],
            ..GraphProto::default()
        };
        let model = ModelProto {
            ir_version: Some(ir),
            opset_import: vec![OperatorSetIdProto { domain: Some(String::new()), version: Some(opset) }],
            producer_name: Some("trainrun".into()),
            producer_version: Some(env!("CARGO_PKG_VERSION").into()),
            graph: Some(graph),
            ..ModelProto::default()
        };
        model.encode_to_vec()
    }

    /// Adds a node whose one output is named after `name` (made unique); returns that name.
    fn node(&mut self, op: &str, name: &str, inputs: &[&str], attribute: Vec<AttributeProto>) -> String {
        self.counter += 1;
        let output = if name == "output" { name.to_string() } else { format!("{name}:{}", self.counter) };
        self.nodes.push(NodeProto {
            input: inputs.iter().map(|s| s.to_string()).collect(),
            output: vec![output.clone()],
            name: Some(format!("{name}#{}", self.counter)),
            op_type: Some(op.into()),
            attribute,
            ..NodeProto::default()
        });
        output
    }

    fn channels_first(&mut self, at: &mut GraphValue) {
        if !at.nchw && at.shape.len() == 3 {
            at.name = self.node("Transpose", "to_nchw", &[&at.name], vec![ints("perm", &[0, 3, 1, 2])]);
            at.nchw = true;
        }
    }

    fn channels_last(&mut self, at: &mut GraphValue) {
        if at.nchw {
            at.name = self.node("Transpose", "to_nhwc", &[&at.name], vec![ints("perm", &[0, 2, 3, 1])]);
            at.nchw = false;
        }
    }

    /// A float initializer named `name` holding `values`, shaped `dims`.
    fn tensor(&mut self, name: &str, values: Vec<f32>, dims: &[usize]) -> String {
        self.initializers.push(TensorProto {
            dims: dims.iter().map(|&d| d as i64).collect(),
            data_type: Some(DataType::Float as i32),
            name: Some(name.into()),
            raw_data: Some(values.iter().flat_map(|v| v.to_le_bytes()).collect()),
            ..TensorProto::default()
        });
        name.into()
    }

    fn weight(&mut self, name: &str, offset: usize, dims: &[usize]) -> String {
        let len: usize = dims.iter().product();
        let values = self.params.get(offset..offset + len).unwrap_or_default().to_vec();
        self.tensor(name, values, dims)
    }

    fn statistic(&mut self, name: &str, offset: usize, len: usize) -> String {
        let values = self.state.get(offset..offset + len).unwrap_or_default().to_vec();
        self.tensor(name, values, &[len])
    }

    fn constant_i64(&mut self, name: &str, values: &[i64]) -> String {
        self.initializers.push(TensorProto {
            dims: vec![values.len() as i64],
            data_type: Some(DataType::Int64 as i32),
            name: Some(name.into()),
            int64_data: values.to_vec(),
            ..TensorProto::default()
        });
        name.into()
    }

    fn activation(&mut self, name: &str, a: Activation, x: &str) -> String {
        match a {
            Activation::Linear => x.to_string(),
            Activation::Relu => self.node("Relu", &format!("{name}/relu"), &[x], vec![]),
            Activation::Sigmoid => self.node("Sigmoid", &format!("{name}/sigmoid"), &[x], vec![]),
            Activation::Tanh => self.node("Tanh", &format!("{name}/tanh"), &[x], vec![]),
            Activation::Softmax => self.node("Softmax", &format!("{name}/softmax"), &[x], vec![int("axis", -1)]),
        }
    }

    /// A convolution on an NCHW value: Keras's `[kh, kw, cin, cout]` kernel becomes ONNX's
    /// `[cout, cin, kh, kw]`.
    fn conv(&mut self, name: &str, x: &str, c: &ConvOp) -> String {
        let w = c.window;
        let len = w.kh * w.kw * w.c * c.filters;
        let keras = self.params.get(c.kernel..c.kernel + len).unwrap_or_default();
        let mut onnx = vec![0.0f32; keras.len()];
        for (i, v) in keras.iter().enumerate() {
            let (o, rest) = (i % c.filters, i / c.filters);
            let (ci, rest) = (rest % w.c, rest / w.c);
            let (kx, ky) = (rest % w.kw, rest / w.kw);
            onnx[((o * w.c + ci) * w.kh + ky) * w.kw + kx] = *v;
        }
        let kernel = self.tensor(&format!("{name}/kernel"), onnx, &[c.filters, w.c, w.kh, w.kw]);
        let mut inputs = vec![x.to_string(), kernel];
        if let Some(b) = c.bias {
            inputs.push(self.weight(&format!("{name}/bias"), b, &[c.filters]));
        }
        let attrs = vec![ints("kernel_shape", &[w.kh, w.kw]), ints("strides", &[w.sh, w.sw]), pads(&w)];
        let refs: Vec<&str> = inputs.iter().map(String::as_str).collect();
        let y = self.node("Conv", name, &refs, attrs);
        self.activation(name, c.activation, &y)
    }

    fn batch_norm(&mut self, name: &str, x: &str, b: &BatchNormOp) -> String {
        let gamma = self.weight(&format!("{name}/gamma"), b.gamma, &[b.channels]);
        let beta = self.weight(&format!("{name}/beta"), b.beta, &[b.channels]);
        let mean = self.statistic(&format!("{name}/moving_mean"), b.moving_mean, b.channels);
        let var = self.statistic(&format!("{name}/moving_variance"), b.moving_variance, b.channels);
        let attrs = vec![float("epsilon", b.epsilon)];
        self.node("BatchNormalization", name, &[x, &gamma, &beta, &mean, &var], attrs)
    }

    /// relu(bn2(conv2(relu(bn1(conv1(x))))) + shortcut(x)), on NCHW values.
    fn residual(&mut self, name: &str, x: &str, r: &ResidualOp) -> String {
        let y = self.conv(&format!("{name}/conv_1"), x, &r.conv1);
        let y = self.batch_norm(&format!("{name}/bn_1"), &y, &r.bn1);
        let y = self.node("Relu", &format!("{name}/relu_1"), &[&y], vec![]);
        let y = self.conv(&format!("{name}/conv_2"), &y, &r.conv2);
        let y = self.batch_norm(&format!("{name}/bn_2"), &y, &r.bn2);
        let shortcut = match &r.shortcut {
            Some((c, b)) => {
                let s = self.conv(&format!("{name}/shortcut_conv"), x, c);
                self.batch_norm(&format!("{name}/shortcut_bn"), &s, b)
            }
            None => x.to_string(),
        };
        let sum = self.node("Add", &format!("{name}/add"), &[&y, &shortcut], vec![]);
        self.node("Relu", &format!("{name}/relu"), &[&sum], vec![])
    }
}

/// Explicit `[top, left, bottom, right]` padding as trainrun computes it (Keras's `same` puts
/// the odd pixel after).
fn pads(w: &Window) -> AttributeProto {
    let bottom = ((w.oh - 1) * w.sh + w.kh).saturating_sub(w.h + w.pad_top);
    let right = ((w.ow - 1) * w.sw + w.kw).saturating_sub(w.w + w.pad_left);
    ints("pads", &[w.pad_top, w.pad_left, bottom, right])
}

fn int(name: &str, v: i64) -> AttributeProto {
    AttributeProto {
        name: Some(name.into()),
        r#type: Some(AttributeType::Int as i32),
        i: Some(v),
        ..Default::default()
    }
}

fn ints(name: &str, v: &[usize]) -> AttributeProto {
    AttributeProto {
        name: Some(name.into()),
        r#type: Some(AttributeType::Ints as i32),
        ints: v.iter().map(|&x| x as i64).collect(),
        ..Default::default()
    }
}

fn float(name: &str, v: f32) -> AttributeProto {
    AttributeProto {
        name: Some(name.into()),
        r#type: Some(AttributeType::Float as i32),
        f: Some(v),
        ..Default::default()
    }
}

/// A value of `elem` `[batch, *shape]` with a symbolic batch.
fn value_info(name: &str, elem: DataType, shape: &[usize]) -> ValueInfoProto {
    let batch = tensor_shape_proto::Dimension {
        value: Some(tensor_shape_proto::dimension::Value::DimParam("batch".into())),
        ..Default::default()
    };
    let dims = std::iter::once(batch).chain(shape.iter().map(|&d| tensor_shape_proto::Dimension {
        value: Some(tensor_shape_proto::dimension::Value::DimValue(d as i64)),
        ..Default::default()
    }));
    let tensor =
        type_proto::Tensor { elem_type: Some(elem as i32), shape: Some(TensorShapeProto { dim: dims.collect() }) };
    ValueInfoProto {
        name: Some(name.into()),
        r#type: Some(TypeProto { value: Some(type_proto::Value::TensorType(tensor)), ..Default::default() }),
        ..Default::default()
    }
}
