//! `trainrun check`: prints the plan — what a run would do — without training.

use crate::exit::RunError;
use crate::prepare::{Invocation, flag, prepare};

/// Prints the plan of `inv`'s spec, as text or JSON.
pub fn check(inv: &Invocation, json: bool) -> Result<(), RunError> {
    let p = prepare(inv)?;
    let source = &p.plan.data.source;
    let model = p.plan.model.build().map_err(|e| RunError::Failure(e.to_string()))?;
    if json {
        let text = serde_json::to_string_pretty(&p.plan).map_err(|e| RunError::Failure(e.to_string()))?;
        println!("{text}");
        return Ok(());
    }
    print!("{}", p.plan.render());
    let dir = source.dir().map_or("(generated)".to_string(), |d| d.display().to_string());
    let missing = source.missing_files();
    // Other sources' missing files already failed the plan, which reads their headers.
    let fetch = match (missing.as_slice(), flag(&inv.env, "TRAINRUN_OFFLINE")) {
        ([], _) => String::new(),
        (files, false) => format!(" (not there yet: {}; a run downloads them first)", files.join(", ")),
        (files, true) => {
            format!(" (missing: {}; TRAINRUN_OFFLINE is set, so a run here would stop on them)", files.join(", "))
        }
    };
    println!("  {:<20}  {dir}{fetch}", "data folder");
    print!("{}", crate::model::summary(&model));
    if let Some(sweep) = &p.loaded.spec.sweep {
        println!("{}", crate::sweep::check_note(&p.loaded, sweep)?);
    }
    Ok(())
}
