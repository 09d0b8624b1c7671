//! `trainrun check`: prints the plan — what a run would do — without training.

use crate::exit::RunError;
use crate::prepare::{Invocation, prepare};

/// Prints the plan of `inv`'s spec, as text or JSON.
pub fn check(inv: &Invocation, json: bool) -> Result<(), RunError> {
    let p = prepare(inv)?;
    let model = p.plan.model.build().map_err(|e| RunError::Failure(e.to_string()))?;
    if json {
        let text = serde_json::to_string_pretty(&p.plan).map_err(|e| RunError::Failure(e.to_string()))?;
        println!("{text}");
        return Ok(());
    }
    print!("{}", p.plan.render());
    let dir = p.plan.data.source.dir().map_or("(generated)".to_string(), |d| d.display().to_string());
    println!("  {:<20}  {dir}", "data folder");
    print!("{}", crate::model::summary(&model));
    if let Some(sweep) = &p.loaded.spec.sweep {
        println!("{}", crate::sweep::check_note(&p.loaded, sweep)?);
    }
    Ok(())
}
