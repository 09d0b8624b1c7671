//! `ParameterServerStrategy`'s runtime, one file per piece: the chief's coordinator
//! (`coordinator.rs`) and its ends of the data plane (`client.rs`), the ps tasks (`ps.rs`),
//! the workers' loop (`worker.rs`), where shards lie in the model's buffers (`layout.rs`) and
//! the wire format (`wire.rs`), with shared memory between a worker and a ps on one
//! host (`shared.rs`). The chief trains through `train::fit`, as every strategy does; its
//! strategy (`chief.rs`) schedules the steps on the workers.

pub mod chief;
pub mod client;
pub mod coordinator;
pub mod layout;
pub mod ps;
mod shared;
pub mod stats;
mod wire;
pub mod worker;
