//! trainrun: a declarative distributed training runner. A TOML spec goes in
//! ([`spec`]), a pure [`plan`] comes out, and the runtime trains it.

pub mod engine;
pub mod model;
pub mod spec;
