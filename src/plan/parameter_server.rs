//! `parameter_server`, planned: how each variable is split along axis 0 (TensorFlow's
//! `FixedShardsPartitioner`, `MinSizePartitioner`, `MaxSizePartitioner`), which ps task holds
//! each shard, the bytes per ps, and the coordinator's queue, staleness bound and steps per
//! closure. Pure: `trainrun check` prints exactly this.

use crate::collective::TransportKind;
use crate::model::ModelPlan;
use crate::spec::{CollectiveTransport, Diagnostic, Spec, StrategySpec, VariablePartitioner};
use serde::Serialize;
use std::num::{NonZeroU64, NonZeroUsize};

/// Bytes per value: every variable is `f32`.
const VALUE_BYTES: u64 = 4;

/// One piece of a variable on one ps task: rows `start..start + rows` of axis 0.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct VariableShard {
    /// The ps task's index.
    pub ps: usize,
    /// First row of axis 0.
    pub start: usize,
    /// Rows of axis 0 (the whole variable when it is not split).
    pub rows: usize,
    /// Bytes the shard holds.
    pub bytes: u64,
}

/// A variable by its Keras path, with its shards in row order.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct VariablePlacement {
    /// `layer/weight`, the name checkpoints use.
    pub name: String,
    /// The whole variable's shape.
    pub shape: Vec<usize>,
    /// Whether it is trained (else a statistic such as a moving mean).
    pub trainable: bool,
    /// Its shards; one when the variable is whole.
    pub shards: Vec<VariableShard>,
}

/// The parameter-server layout and the coordinator's settings.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ParameterServerPlan {
    /// ps tasks.
    pub num_ps: usize,
    /// Every variable in creation order, with where its shards live.
    pub variables: Vec<VariablePlacement>,
    /// Bytes of variables each ps task holds (its optimizer state comes on top).
    pub bytes_per_ps: Vec<u64>,
    /// Closures the coordinator's queue holds before `schedule` blocks.
    pub queue_size: NonZeroUsize,
    /// A worker this many steps ahead of the slowest waits; `None`: unbounded.
    pub max_staleness: Option<u64>,
    /// Steps per scheduled closure.
    pub steps_per_execution: NonZeroU64,
    /// The workers' data plane to the ps tasks: `SharedMemory` moves pulls and pushes of a
    /// worker and a ps on one host through a shared segment; `Tcp` moves everything over TCP.
    pub transport: TransportKind,
    /// `strategy.transport = "auto"`: a worker and a ps on different hosts, or whose segment
    /// cannot be set up, use TCP instead of failing the job.
    pub auto_transport: bool,
    /// Threads the chief evaluates with: `run.threads` when set, else every core of its
    /// machine, as the workers wait during an evaluation and the chief computes nothing else.
    pub eval_threads: usize,
}

/// Shards along axis 0 of a variable of `shape`, as the partitioner decides. Rank-0 variables
/// are never split.
pub fn num_shards(partitioner: VariablePartitioner, shape: &[usize]) -> usize {
    let Some(&rows) = shape.first() else { return 1 };
    if rows == 0 {
        return 1;
    }
    let numel: u64 = shape.iter().map(|&d| d as u64).product();
    let clamp = |n: u64| usize::try_from(n).unwrap_or(usize::MAX).clamp(1, rows);
    match partitioner {
        VariablePartitioner::RoundRobin => 1,
        // `FixedShardsPartitioner`: min(num_shards, shape[axis]).
        VariablePartitioner::FixedShards { shards } => clamp(u64::from(shards.get())),
        // `min_max_variable_partitioner`: ceil(total bytes / min_slice_size), capped by the
        // rows and `max_partitions`, at least 1.
        VariablePartitioner::MinSize { min_shard_bytes, max_shards } => {
            let wanted = (numel * VALUE_BYTES).div_ceil(min_shard_bytes.get());
            clamp(wanted.min(u64::from(max_shards.get())))
        }
        // `variable_axis_size_partitioner`: as many rows per shard as fit in max_shard_bytes
        // (at least one), then ceil(rows / rows per shard), capped by `max_shards`.
        VariablePartitioner::MaxSize { max_shard_bytes, max_shards } => {
            let bytes_per_row = (numel / rows as u64) * VALUE_BYTES;
            let rows_per_shard = (max_shard_bytes.get() / bytes_per_row.max(1)).max(1);
            let wanted = (rows as u64).div_ceil(rows_per_shard);
            clamp(max_shards.map_or(wanted, |m| wanted.min(u64::from(m.get()))))
        }
    }
}

/// Rows of each of `shards` shards of `rows` rows, div-style as TensorFlow's
/// `ParameterServerStrategy` splits them: the first `rows % shards` shards take one extra row.
pub fn split_rows(rows: usize, shards: usize) -> Vec<usize> {
    let shards = shards.max(1);
    let (base, extra) = (rows / shards, rows % shards);
    (0..shards).map(|i| base + usize::from(i < extra)).collect()
}

/// Places `variables` (name, shape, trainable) over `num_ps` tasks: every shard, and every
/// whole variable, goes to the next ps in turn, as TensorFlow's round-robin placement does.
pub fn place(
    variables: &[(String, Vec<usize>, bool)],
    partitioner: VariablePartitioner,
    num_ps: NonZeroUsize,
) -> (Vec<VariablePlacement>, Vec<u64>) {
    let mut next = 0usize;
    let mut bytes_per_ps = vec![0u64; num_ps.get()];
    let placed = variables
        .iter()
        .map(|(name, shape, trainable)| {
            let row_values: u64 = shape.iter().skip(1).map(|&d| d as u64).product();
            let mut start = 0;
            let split = match shape.first() {
                Some(&rows) => split_rows(rows, num_shards(partitioner, shape)),
                None => vec![1],
            };
            let shards = split
                .into_iter()
                .map(|rows| {
                    let ps = next % num_ps.get();
                    next += 1;
                    let bytes = rows as u64 * row_values * VALUE_BYTES;
                    bytes_per_ps[ps] += bytes;
                    let shard = VariableShard { ps, start, rows, bytes };
                    start += rows;
                    shard
                })
                .collect();
            VariablePlacement { name: name.clone(), shape: shape.clone(), trainable: *trainable, shards }
        })
        .collect();
    (placed, bytes_per_ps)
}

/// Plans the parameter servers when `strategy.kind = "parameter_server"`; `None` otherwise or
/// when the cluster has no ps (the strategy slice reports that).
pub fn resolve(
    spec: &Spec,
    num_ps: usize,
    model: Option<&ModelPlan>,
    cores: usize,
    diags: &mut Vec<Diagnostic>,
) -> Option<ParameterServerPlan> {
    let StrategySpec::ParameterServer { variable_partitioner, max_staleness, queue_size, transport, .. } =
        &spec.strategy
    else {
        return None;
    };
    if spec.train.steps_per_epoch.is_none() {
        // As TensorFlow: with asynchronous workers an epoch has no natural end.
        diags.push(
            Diagnostic::error(
                "train.steps_per_epoch",
                "strategy.kind = \"parameter_server\" needs train.steps_per_epoch: asynchronous workers each read their own stream, so an epoch has no natural end",
            )
            .help("set train.steps_per_epoch, e.g. steps_per_epoch = 100"),
        );
    }
    let num_ps = NonZeroUsize::new(num_ps)?;
    let model = model?;
    let variables: Vec<(String, Vec<usize>, bool)> = match model.build() {
        Ok(m) => {
            // The arena holds layers last first (for backward); TensorFlow places variables
            // in creation order, layer by layer from the input.
            let mut ordered = Vec::new();
            for layer in m.layer_views() {
                let prefix = format!("{}/", layer.name);
                let mine = |t: &&crate::engine::TensorInfo| t.name.starts_with(&prefix);
                ordered.extend(m.tensors().iter().filter(mine).map(|t| (t.name.clone(), t.shape.clone(), true)));
                ordered.extend(m.state_tensors().iter().filter(mine).map(|t| (t.name.clone(), t.shape.clone(), false)));
            }
            ordered
        }
        Err(e) => {
            diags.push(Diagnostic::error("model", e.to_string()));
            return None;
        }
    };
    let (variables, bytes_per_ps) = place(&variables, *variable_partitioner, num_ps);
    if let Some(idle) = idle_servers(&variables, num_ps.get()) {
        diags.push(idle);
    }
    Some(ParameterServerPlan {
        num_ps: num_ps.get(),
        variables,
        bytes_per_ps,
        queue_size: NonZeroUsize::new(queue_size.get() as usize).unwrap_or(NonZeroUsize::MIN),
        max_staleness: max_staleness.map(u64::from),
        steps_per_execution: spec.train.steps_per_execution,
        // Whether a worker and a ps share a host is a property of each pair, known once they
        // are connected (`strategy::parameter_server::shared`), so `auto` asks for shared
        // memory wherever it can work.
        transport: match transport {
            CollectiveTransport::Auto | CollectiveTransport::SharedMemory => TransportKind::SharedMemory,
            CollectiveTransport::Tcp => TransportKind::Tcp,
        },
        auto_transport: *transport == CollectiveTransport::Auto,
        eval_threads: spec.run.threads.map_or(cores.max(1), |t| t.get()),
    })
}

/// A warning naming the ps tasks that hold no shard: round-robin placement of fewer shards
/// than servers leaves the rest idle, each a process and a connection per worker for nothing.
fn idle_servers(variables: &[VariablePlacement], num_ps: usize) -> Option<Diagnostic> {
    let shards = variables.iter().map(|v| v.shards.len()).sum::<usize>();
    let idle: Vec<String> = (0..num_ps)
        .filter(|&ps| !variables.iter().flat_map(|v| &v.shards).any(|s| s.ps == ps))
        .map(|ps| format!("ps:{ps}"))
        .collect();
    (!idle.is_empty()).then(|| {
        let (n, vars) = (variables.len(), if variables.len() == 1 { "variable" } else { "variables" });
        Diagnostic::warning(
            "cluster.ps",
            format!("{num_ps} parameter servers for {n} {vars} in {shards} shard(s): {} hold nothing", idle.join(", ")),
        )
        .help(format!(
            "use cluster.ps = {}, or split the variables over more servers with strategy.variable_partitioner",
            num_ps - idle.len()
        ))
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::num::{NonZeroU32, NonZeroU64};

    fn nz32(n: u32) -> NonZeroU32 {
        NonZeroU32::new(n).unwrap()
    }

    fn nz64(n: u64) -> NonZeroU64 {
        NonZeroU64::new(n).unwrap()
    }

    #[test]
    fn fixed_shards_matches_tensorflows_example() {
        // `FixedShardsPartitioner(num_shards=2)(TensorShape([10, 3]), tf.float32) == [2, 1]`.
        let p = VariablePartitioner::FixedShards { shards: nz32(2) };
        assert_eq!(num_shards(p, &[10, 3]), 2);
        // Never more shards than rows.
        assert_eq!(num_shards(VariablePartitioner::FixedShards { shards: nz32(5) }, &[3, 4]), 3);
    }

    #[test]
    fn min_size_matches_tensorflows_examples() {
        // `MinSizePartitioner(min_shard_bytes=4, max_shards=2)(TensorShape([6, 1]), tf.float32) == [2, 1]`.
        let p = VariablePartitioner::MinSize { min_shard_bytes: nz64(4), max_shards: nz32(2) };
        assert_eq!(num_shards(p, &[6, 1]), 2);
        // `MinSizePartitioner(min_shard_bytes=4, max_shards=10)(...) == [6, 1]`.
        let p = VariablePartitioner::MinSize { min_shard_bytes: nz64(4), max_shards: nz32(10) };
        assert_eq!(num_shards(p, &[6, 1]), 6);
        // The `min_max_variable_partitioner` doc: [1024, 1024] floats at 256 KiB are 16 shards,
        // or `max_partitions` when fewer.
        let p = |max| VariablePartitioner::MinSize { min_shard_bytes: nz64(256 << 10), max_shards: nz32(max) };
        assert_eq!(num_shards(p(32), &[1024, 1024]), 16);
        assert_eq!(num_shards(p(8), &[1024, 1024]), 8);
        // Smaller than one minimum shard: one shard.
        assert_eq!(num_shards(p(8), &[10, 10]), 1);
    }

    #[test]
    fn max_size_matches_tensorflows_examples() {
        // `MaxSizePartitioner(max_shard_bytes=4)(TensorShape([6, 1]), tf.float32) == [6, 1]`.
        let p = VariablePartitioner::MaxSize { max_shard_bytes: nz64(4), max_shards: None };
        assert_eq!(num_shards(p, &[6, 1]), 6);
        // `MaxSizePartitioner(max_shard_bytes=4, max_shards=2)(...) == [2, 1]`.
        let p = VariablePartitioner::MaxSize { max_shard_bytes: nz64(4), max_shards: Some(nz32(2)) };
        assert_eq!(num_shards(p, &[6, 1]), 2);
        // `MaxSizePartitioner(max_shard_bytes=1024)(...) == [1, 1]`.
        let p = VariablePartitioner::MaxSize { max_shard_bytes: nz64(1024), max_shards: None };
        assert_eq!(num_shards(p, &[6, 1]), 1);
        // A row larger than the limit still makes a shard of one row.
        let p = VariablePartitioner::MaxSize { max_shard_bytes: nz64(8), max_shards: None };
        assert_eq!(num_shards(p, &[3, 100]), 3);
    }

    #[test]
    fn round_robin_and_rank_zero_are_whole() {
        assert_eq!(num_shards(VariablePartitioner::RoundRobin, &[1000, 1000]), 1);
        assert_eq!(num_shards(VariablePartitioner::FixedShards { shards: nz32(4) }, &[]), 1);
    }

    #[test]
    fn rows_split_div_style() {
        // 13 rows over 5 shards: 3/3/3/2/2.
        assert_eq!(split_rows(13, 5), vec![3, 3, 3, 2, 2]);
        assert_eq!(split_rows(10, 2), vec![5, 5]);
        assert_eq!(split_rows(4, 1), vec![4]);
    }

    #[test]
    fn whole_variables_go_round_robin() {
        // Four variables over three ps land on ps 0, 1, 2, 0.
        let vars: Vec<_> = (0..4).map(|i| (format!("v{i}"), vec![2, 2], true)).collect();
        let (placed, bytes) = place(&vars, VariablePartitioner::RoundRobin, NonZeroUsize::new(3).unwrap());
        let ps: Vec<usize> = placed.iter().map(|v| v.shards[0].ps).collect();
        assert_eq!(ps, vec![0, 1, 2, 0]);
        assert_eq!(bytes, vec![32, 16, 16]);
    }

    #[test]
    fn shards_continue_the_round_robin() {
        // A [13, 2] variable in 5 shards over 2 ps, then a whole bias: the shards take ps
        // 0, 1, 0, 1, 0 with rows 3/3/3/2/2 at offsets 0/3/6/9/11, the bias ps 1.
        let vars = vec![("dense/kernel".to_string(), vec![13, 2], true), ("dense/bias".to_string(), vec![2], true)];
        let p = VariablePartitioner::FixedShards { shards: nz32(5) };
        let (placed, bytes) = place(&vars, p, NonZeroUsize::new(2).unwrap());
        let k: Vec<(usize, usize, usize)> = placed[0].shards.iter().map(|s| (s.ps, s.start, s.rows)).collect();
        assert_eq!(k, vec![(0, 0, 3), (1, 3, 3), (0, 6, 3), (1, 9, 2), (0, 11, 2)]);
        // The bias has two rows, so it is split in two as well: ps 1 and ps 0.
        let b: Vec<usize> = placed[1].shards.iter().map(|s| s.ps).collect();
        assert_eq!(b, vec![1, 0]);
        assert_eq!(bytes.iter().sum::<u64>(), (13 * 2 + 2) * 4);
        assert_eq!(bytes, vec![(3 + 3 + 2) * 8 + 4, (3 + 2) * 8 + 4]);
    }
}
