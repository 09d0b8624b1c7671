//! `ParameterServerStrategy`'s runtime pieces, one file each: the chief's coordinator
//! (`coordinator.rs`). The ps tasks, the push/pull transport and the workers' loop are not
//! built yet, so `strategy::build` still refuses the strategy.

pub mod coordinator;
