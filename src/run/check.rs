//! `trainrun check`: prints the plan — what a run would do — without training. A model this
//! machine cannot hold is not an error here (a spec is often checked on a laptop for a
//! cluster): check prints its memory estimate and a warning, and a run refuses it.

use crate::exit::RunError;
use crate::prepare::{Invocation, flag, prepare_or_too_big};

/// Prints the plan of `inv`'s spec, as text or JSON.
pub fn check(inv: &Invocation, json: bool) -> Result<(), RunError> {
    let p = match prepare_or_too_big(inv)? {
        Ok(p) => p,
        Err(too_big) => {
            if json {
                let text = serde_json::json!({ "memory": too_big.estimate, "machine": too_big.machine, "fits": false });
                println!("{}", serde_json::to_string_pretty(&text).map_err(|e| RunError::Failure(e.to_string()))?);
            }
            eprintln!("warning: {too_big}");
            eprintln!(
                "  = note: the plan stops here, before the model is expanded; a run on this machine exits 3, one on a machine with more memory goes on"
            );
            return Ok(());
        }
    };
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
    if let Some(init) = &p.plan.model.init_from {
        let layout = crate::builder::layout(&model);
        let tensors: Vec<_> = layout.tensors.iter().chain(&layout.state_tensors).collect();
        let survey = crate::checkpoint::warm_start::survey(init, &p.plan.model, &tensors)?;
        println!(
            "{}",
            crate::builder::warm_start_note(&survey).replacen("warm start from", "warm start: will load from", 1)
        );
        if init.strict && !survey.mismatches().is_empty() {
            return Err(RunError::Usage(format!(
                "model.init_from is strict and {} does not match the model (the lines above); a run would stop here: \
                 set model.init_from.strict = false to load what matches",
                survey.file.display()
            )));
        }
    }
    if let Some(sweep) = &p.loaded.spec.sweep {
        println!("{}", crate::sweep::check_note(&p.loaded, &p.plan, sweep)?);
    }
    Ok(())
}
