//! Where each ps task's shards lie in the model's flat buffers. A shard is rows of axis 0 of
//! a variable stored row-major, so it is one contiguous range of the trainable arena or of
//! the state buffer; a ps holds its ranges back to back, in the plan's order, and every
//! pull, push and checkpoint moves them in that order.

use crate::engine::TensorInfo;
use crate::plan::ParameterServerPlan;
use std::ops::Range;

/// One shard's place in the model's buffers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Piece {
    /// In the state buffer (non-trainable) rather than the trainable arena.
    pub state: bool,
    /// Its values there.
    pub range: Range<usize>,
}

/// Every ps task's pieces, indexed by ps.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PsLayout {
    pub ps: Vec<Vec<Piece>>,
}

impl PsLayout {
    /// The plan's placement over the model whose buffers `tensors` and `state_tensors`
    /// describe; `Err` names a planned variable the model lacks.
    pub fn new(
        plan: &ParameterServerPlan,
        tensors: &[TensorInfo],
        state_tensors: &[TensorInfo],
    ) -> Result<Self, String> {
        let mut ps = vec![Vec::new(); plan.num_ps];
        for v in &plan.variables {
            let list = if v.trainable { tensors } else { state_tensors };
            let t = list
                .iter()
                .find(|t| t.name == v.name)
                .ok_or_else(|| format!("the model has no variable `{}`", v.name))?;
            let row: usize = t.shape.iter().skip(1).product();
            for s in &v.shards {
                let start = t.offset + s.start * row;
                let piece = Piece { state: !v.trainable, range: start..start + s.rows * row };
                ps.get_mut(s.ps)
                    .ok_or_else(|| format!("`{}` is placed on ps {} of {}", v.name, s.ps, plan.num_ps))?
                    .push(piece);
            }
        }
        Ok(Self { ps })
    }

    /// Trainable values ps `i` holds.
    pub fn trainable_len(&self, i: usize) -> usize {
        self.ps[i].iter().filter(|p| !p.state).map(|p| p.range.len()).sum()
    }

    /// Values ps `i` holds, trainable and state.
    pub fn len(&self, i: usize) -> usize {
        self.ps[i].iter().map(|p| p.range.len()).sum()
    }
}

/// Ps `pieces` in the order their values travel on the wire: the trainable ones first, then
/// the state ones, each in placement order.
pub fn wire_order(pieces: &[Piece]) -> impl Iterator<Item = &Piece> {
    pieces.iter().filter(|p| !p.state).chain(pieces.iter().filter(|p| p.state))
}

/// Appends ps `pieces`' values from `params` and `state` to `out`, in [`wire_order`].
pub fn gather(pieces: &[Piece], params: &[f32], state: &[f32], out: &mut Vec<f32>) {
    for p in wire_order(pieces) {
        out.extend_from_slice(&if p.state { state } else { params }[p.range.clone()]);
    }
}

/// Writes `values` (as [`gather`] lays them out) back into `params` and `state`.
pub fn scatter(pieces: &[Piece], values: &[f32], params: &mut [f32], state: &mut [f32]) {
    let mut at = 0;
    for p in wire_order(pieces) {
        let into = if p.state { &mut *state } else { &mut *params };
        into[p.range.clone()].copy_from_slice(&values[at..at + p.range.len()]);
        at += p.range.len();
    }
}

/// Appends the trainable pieces' values of `buffer` (an optimizer slot, shaped as the
/// trainable arena) to `out`.
pub fn gather_trainable(pieces: &[Piece], buffer: &[f32], out: &mut Vec<f32>) {
    for p in pieces.iter().filter(|p| !p.state) {
        out.extend_from_slice(&buffer[p.range.clone()]);
    }
}

/// Writes `values` (as [`gather_trainable`] lays them out) back into `buffer`.
pub fn scatter_trainable(pieces: &[Piece], values: &[f32], buffer: &mut [f32]) {
    let mut at = 0;
    for p in pieces.iter().filter(|p| !p.state) {
        buffer[p.range.clone()].copy_from_slice(&values[at..at + p.range.len()]);
        at += p.range.len();
    }
}

/// The tensors of a ps's own trainable buffer (its pieces back to back), named as the model's
/// so that an optimizer's per-tensor rules (weight decay of matrices only) apply to shards as
/// to whole variables.
pub fn local_tensors(pieces: &[Piece], tensors: &[TensorInfo]) -> Vec<TensorInfo> {
    let mut at = 0;
    let mut out = Vec::new();
    for p in pieces.iter().filter(|p| !p.state) {
        if let Some(t) = tensors.iter().find(|t| t.offset <= p.range.start && p.range.end <= t.offset + t.len()) {
            let row: usize = t.shape.iter().skip(1).product();
            let mut shape = t.shape.clone();
            if let Some(rows) = shape.first_mut() {
                *rows = p.range.len() / row.max(1);
            }
            out.push(TensorInfo { name: t.name.clone(), shape, offset: at });
        }
        at += p.range.len();
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::{VariablePlacement, VariableShard};
    use std::num::{NonZeroU64, NonZeroUsize};

    #[test]
    fn shards_are_row_ranges_and_round_trip() {
        // kernel [3, 2] at 0 split 2/1 over ps 0 and 1; bias [2] at 6 on ps 0; a moving
        // mean [2] in the state buffer on ps 1.
        let tensors = vec![
            TensorInfo { name: "d/kernel".into(), shape: vec![3, 2], offset: 0 },
            TensorInfo { name: "d/bias".into(), shape: vec![2], offset: 6 },
        ];
        let state = vec![TensorInfo { name: "bn/moving_mean".into(), shape: vec![2], offset: 0 }];
        let shard = |ps, start, rows| VariableShard { ps, start, rows, bytes: 0 };
        let var =
            |name: &str, trainable, shards| VariablePlacement { name: name.into(), shape: vec![], trainable, shards };
        let plan = ParameterServerPlan {
            num_ps: 2,
            variables: vec![
                var("d/kernel", true, vec![shard(0, 0, 2), shard(1, 2, 1)]),
                var("d/bias", true, vec![shard(0, 0, 2)]),
                var("bn/moving_mean", false, vec![shard(1, 0, 2)]),
            ],
            bytes_per_ps: vec![0, 0],
            queue_size: NonZeroUsize::MIN,
            max_staleness: None,
            transport: crate::collective::TransportKind::Tcp,
            auto_transport: false,
            eval_threads: 1,
            steps_per_execution: NonZeroU64::MIN,
        };
        let layout = PsLayout::new(&plan, &tensors, &state).unwrap();
        assert_eq!(layout.ps[0], vec![Piece { state: false, range: 0..4 }, Piece { state: false, range: 6..8 }]);
        assert_eq!(layout.ps[1], vec![Piece { state: false, range: 4..6 }, Piece { state: true, range: 0..2 }]);
        assert_eq!((layout.trainable_len(1), layout.len(1)), (2, 4));
        let params: Vec<f32> = (0..8).map(|v| v as f32).collect();
        let moving = vec![10.0, 11.0];
        let (mut back, mut back_state) = (vec![0.0; 8], vec![0.0; 2]);
        for pieces in &layout.ps {
            let mut values = Vec::new();
            gather(pieces, &params, &moving, &mut values);
            scatter(pieces, &values, &mut back, &mut back_state);
        }
        assert_eq!((back, back_state), (params, moving));
        let local = local_tensors(&layout.ps[0], &tensors);
        assert_eq!(local[0], TensorInfo { name: "d/kernel".into(), shape: vec![2, 2], offset: 0 });
        assert_eq!(local[1], TensorInfo { name: "d/bias".into(), shape: vec![2], offset: 4 });
    }
}
