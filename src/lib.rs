//! trainrun: a declarative distributed training runner. A TOML spec goes in ([`spec`]), a
//! pure [`plan`] comes out, and the runtime trains it: [`data`] feeds a [`strategy`], which
//! runs the [`engine`]'s model replicas; [`train`] drives the loop and writes the run folder.
//! [`collective`] moves gradients between worker processes.

pub mod bench;
pub mod cli;
pub mod collective;
pub mod data;
pub mod engine;
pub mod model;
pub mod plan;
pub mod run;
pub mod spec;
pub mod strategy;
pub mod train;
