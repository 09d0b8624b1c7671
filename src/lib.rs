//! trainrun: a declarative distributed training runner. A TOML spec goes in ([`spec`]), a
//! pure [`plan`] comes out, and the runtime trains it: [`data`] feeds a [`strategy`], which
//! runs [`model`] replicas on the [`engine`]; [`train`] drives the loop and writes the run
//! folder. Across processes, [`cluster`] is the control plane and [`collective`] moves
//! gradients.

pub mod bench;
pub mod builder;
pub mod checkpoint;
pub mod cli;
pub mod cluster;
pub mod collective;
pub mod crash;
pub mod data;
pub mod deploy;
pub mod diagnostic;
pub mod engine;
pub mod exit;
pub mod export;
#[cfg(feature = "cuda")]
pub mod gpu_check;
pub mod machine_memory;
pub mod metrics;
pub mod model;
pub mod plan;
pub mod prepare;
pub mod progress;
pub mod provenance;
pub mod report;
pub mod run;
pub mod signals;
pub mod spec;
pub mod strategy;
pub mod sweep;
pub mod tracking;
pub mod train;
pub mod vocab;
