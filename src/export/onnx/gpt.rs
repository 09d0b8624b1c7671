//! The GPT as one ONNX graph (opset [`GPT_OPSET`], for `LayerNormalization`), written from its
//! tensors by name (the names `checkpoint/hf_gpt2.rs` maps) and the sizes the plan gives.
//!
//! Input `input`: int64 token ids `[batch, T]` (T the run's sequence length); output `output`:
//! float32 logits `[batch, T, vocabulary]`, what trainrun's model computes. Each block is
//! trainrun's pre-LN GPT-2 block: the fused `qkv` product split into heads, scores scaled by
//! 1/√head_dim, a causal mask (−∞ above the diagonal, so masked probabilities are exactly 0 as
//! trainrun's skip them), softmax, the heads merged and projected; the MLP's GELU is written
//! out in its exact (`Erf`) or tanh form, as the model uses. A tied head multiplies by the
//! token embedding's transpose.

use super::{DataType, Graph, OnnxError, float, int, ints, value_info};
use crate::checkpoint::Layout;
use crate::checkpoint::hf_gpt2::Gpt2Shape;

/// The operator set of the GPT's graph: LayerNormalization exists from 17.
pub const GPT_OPSET: i64 = 17;
/// The IR version that opset 17 goes with.
pub const GPT_IR_VERSION: i64 = 8;

/// The ONNX model of the GPT `shape` with `params` laid out by `layout`, over sequences of
/// `seq_len` tokens, serialized.
pub fn export_gpt(
    shape: &Gpt2Shape,
    layout: &Layout,
    params: &[f32],
    seq_len: usize,
    doc: &str,
) -> Result<Vec<u8>, OnnxError> {
    let mut gpt = GptGraph { g: Graph::new(params, &[]), layout, shape, t: seq_len };
    let wte = gpt.param("embedding/embeddings")?;
    let tokens = gpt.g.node("Gather", "embedding", &[&wte, "input"], vec![]);
    let positions = gpt.positions()?;
    let mut h = gpt.g.node("Add", "position_embedding", &[&tokens, &positions], vec![]);
    for i in 0..shape.n_layer {
        let block = if i == 0 { "transformer_block".to_string() } else { format!("transformer_block_{i}") };
        h = gpt.block(&block, &h)?;
    }
    let h = gpt.layer_norm("layer_norm", &h)?;
    let head = if shape.tie_word_embeddings {
        gpt.g.node("Transpose", "lm_head/tied", &[&wte], vec![ints("perm", &[1, 0])])
    } else {
        gpt.param("lm_head/kernel")?
    };
    let logits = gpt.g.node("MatMul", "lm_head", &[&h, &head], vec![]);
    let out = gpt.g.node("Identity", "output", &[&logits], vec![]);
    let io = (
        value_info("input", DataType::Int64, &[seq_len]),
        value_info(&out, DataType::Float, &[seq_len, shape.vocab_size]),
    );
    Ok(gpt.g.finish(io, doc, (GPT_OPSET, GPT_IR_VERSION)))
}

struct GptGraph<'a> {
    g: Graph<'a>,
    layout: &'a Layout,
    shape: &'a Gpt2Shape,
    /// Sequence length.
    t: usize,
}

impl GptGraph<'_> {
    /// The initializer holding the model's tensor `name` (by its Keras path).
    fn param(&mut self, name: &str) -> Result<String, OnnxError> {
        let t =
            self.layout.tensors.iter().find(|t| t.name == name).ok_or_else(|| OnnxError::MissingTensor(name.into()))?;
        Ok(self.g.weight(name, t.offset, &t.shape))
    }

    /// The first T rows of the position table.
    fn positions(&mut self) -> Result<String, OnnxError> {
        let name = "position_embedding/embeddings";
        let t =
            self.layout.tensors.iter().find(|t| t.name == name).ok_or_else(|| OnnxError::MissingTensor(name.into()))?;
        let d = self.shape.n_embd;
        Ok(self.g.weight(name, t.offset, &[self.t, d]))
    }

    fn layer_norm(&mut self, prefix: &str, x: &str) -> Result<String, OnnxError> {
        let gamma = self.param(&format!("{prefix}/gamma"))?;
        let beta = self.param(&format!("{prefix}/beta"))?;
        let attrs = vec![int("axis", -1), float("epsilon", self.shape.layer_norm_epsilon as f32)];
        Ok(self.g.node("LayerNormalization", prefix, &[x, &gamma, &beta], attrs))
    }

    /// `x · kernel + bias` for the dense `prefix` (`…/kernel [in, out]`, `…/bias`).
    fn dense(&mut self, prefix: &str, x: &str) -> Result<String, OnnxError> {
        let kernel = self.param(&format!("{prefix}/kernel"))?;
        let bias = self.param(&format!("{prefix}/bias"))?;
        let y = self.g.node("MatMul", prefix, &[x, &kernel], vec![]);
        Ok(self.g.node("Add", &format!("{prefix}/bias_add"), &[&y, &bias], vec![]))
    }

    fn constant(&mut self, name: &str, values: Vec<f32>, dims: &[usize]) -> String {
        self.g.tensor(name, values, dims)
    }

    fn block(&mut self, b: &str, x: &str) -> Result<String, OnnxError> {
        let a = self.layer_norm(&format!("{b}/ln_1"), x)?;
        let attention = self.attention(&format!("{b}/attention"), &a)?;
        let x1 = self.g.node("Add", &format!("{b}/residual_1"), &[x, &attention], vec![]);
        let m = self.layer_norm(&format!("{b}/ln_2"), &x1)?;
        let f = self.dense(&format!("{b}/mlp_fc"), &m)?;
        let f = self.gelu(&format!("{b}/gelu"), &f);
        let p = self.dense(&format!("{b}/mlp_proj"), &f)?;
        Ok(self.g.node("Add", &format!("{b}/residual_2"), &[&x1, &p], vec![]))
    }

    fn attention(&mut self, p: &str, x: &str) -> Result<String, OnnxError> {
        let (t, d, heads) = (self.t, self.shape.n_embd, self.shape.n_head);
        let hd = d / heads;
        let qkv = self.dense(&format!("{p}/qkv"), x)?;
        let sizes = self.g.constant_i64(&format!("{p}/split"), &[d as i64; 3]);
        let split = format!("{p}/split#{}", self.g.counter + 1);
        let outs = [0, 1, 2].map(|i| format!("{split}:{i}"));
        self.g.counter += 1;
        self.g.nodes.push(super::NodeProto {
            input: vec![qkv, sizes],
            output: outs.to_vec(),
            name: Some(split),
            op_type: Some("Split".into()),
            attribute: vec![int("axis", 2)],
            ..super::NodeProto::default()
        });
        let heads_shape = self.g.constant_i64(&format!("{p}/heads_shape"), &[0, 0, heads as i64, hd as i64]);
        // Queries and values as [batch, heads, T, hd]; keys as [batch, heads, hd, T] for the product.
        let mut split_heads = |n: &str, at: &str, perm: [usize; 4]| {
            let r = self.g.node("Reshape", &format!("{p}/{n}_heads"), &[at, &heads_shape], vec![]);
            self.g.node("Transpose", &format!("{p}/{n}_t"), &[&r], vec![ints("perm", &perm)])
        };
        let q = split_heads("q", &outs[0], [0, 2, 1, 3]);
        let k = split_heads("k", &outs[1], [0, 2, 3, 1]);
        let v = split_heads("v", &outs[2], [0, 2, 1, 3]);
        let scores = self.g.node("MatMul", &format!("{p}/scores"), &[&q, &k], vec![]);
        let scale = self.constant(&format!("{p}/scale"), vec![1.0 / (hd as f32).sqrt()], &[]);
        let scores = self.g.node("Mul", &format!("{p}/scaled"), &[&scores, &scale], vec![]);
        let mask = (0..t * t).map(|i| if i % t > i / t { f32::NEG_INFINITY } else { 0.0 }).collect();
        let mask = self.constant(&format!("{p}/causal_mask"), mask, &[t, t]);
        let scores = self.g.node("Add", &format!("{p}/masked"), &[&scores, &mask], vec![]);
        let probs = self.g.node("Softmax", &format!("{p}/softmax"), &[&scores], vec![int("axis", -1)]);
        let merged = self.g.node("MatMul", &format!("{p}/weighted"), &[&probs, &v], vec![]);
        let merged = self.g.node("Transpose", &format!("{p}/merge_t"), &[&merged], vec![ints("perm", &[0, 2, 1, 3])]);
        let width = self.g.constant_i64(&format!("{p}/merged_shape"), &[0, 0, d as i64]);
        let merged = self.g.node("Reshape", &format!("{p}/merge"), &[&merged, &width], vec![]);
        self.dense(&format!("{p}/attention_output"), &merged)
    }

    /// GELU: `½x(1 + erf(x/√2))`, or GPT-2's `½x(1 + tanh(√(2/π)(x + 0.044715x³)))`.
    fn gelu(&mut self, p: &str, x: &str) -> String {
        let half = self.constant(&format!("{p}/half"), vec![0.5], &[]);
        let one = self.constant(&format!("{p}/one"), vec![1.0], &[]);
        let inner = if self.shape.approximate_gelu {
            let c = self.constant(&format!("{p}/cubic"), vec![0.044715], &[]);
            let k = self.constant(&format!("{p}/sqrt_2_over_pi"), vec![(2.0 / std::f32::consts::PI).sqrt()], &[]);
            let x2 = self.g.node("Mul", &format!("{p}/x2"), &[x, x], vec![]);
            let x3 = self.g.node("Mul", &format!("{p}/x3"), &[&x2, x], vec![]);
            let cx3 = self.g.node("Mul", &format!("{p}/cx3"), &[&x3, &c], vec![]);
            let u = self.g.node("Add", &format!("{p}/x_plus"), &[x, &cx3], vec![]);
            let u = self.g.node("Mul", &format!("{p}/u"), &[&u, &k], vec![]);
            self.g.node("Tanh", &format!("{p}/tanh"), &[&u], vec![])
        } else {
            let r = self.constant(&format!("{p}/inv_sqrt2"), vec![std::f32::consts::FRAC_1_SQRT_2], &[]);
            let u = self.g.node("Mul", &format!("{p}/u"), &[x, &r], vec![]);
            self.g.node("Erf", &format!("{p}/erf"), &[&u], vec![])
        };
        let s = self.g.node("Add", &format!("{p}/one_plus"), &[&inner, &one], vec![]);
        let hx = self.g.node("Mul", &format!("{p}/half_x"), &[x, &half], vec![]);
        self.g.node("Mul", p, &[&hx, &s], vec![])
    }
}
