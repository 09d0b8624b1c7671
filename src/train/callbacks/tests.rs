use super::*;
use crate::plan::Watch;

fn logs(epoch: u64, val_loss: f64) -> Logs {
    Logs {
        epoch,
        step: epoch * 10,
        loss: 1.0,
        accuracy: Some(0.5),
        val_loss: Some(val_loss),
        val_accuracy: Some(0.9),
        learning_rate: 0.1,
    }
}

fn vars() -> Variables {
    Variables { params: vec![1.0], state: Vec::new() }
}

fn val_loss() -> Watch {
    Watch { monitor: Monitor::ValLoss, direction: Direction::Min }
}

fn stopping(patience: u32) -> Box<dyn Callback> {
    Box::new(early_stopping::EarlyStopping::new("early_stopping".into(), val_loss(), 0.0, patience, false))
}

fn plateau(patience: u32, cooldown: u32, min_lr: f64) -> Box<dyn Callback> {
    Box::new(reduce_lr_on_plateau::ReduceLrOnPlateau::new(
        "reduce_lr_on_plateau".into(),
        val_loss(),
        0.5,
        patience,
        0.0,
        cooldown,
        min_lr,
    ))
}

#[test]
fn early_stopping_waits_patience_epochs() {
    let mut cb = Callbacks::of(vec![stopping(2)]);
    assert_eq!(cb.on_epoch_end(&logs(1, 1.0), &vars()).unwrap(), Control::Continue);
    assert_eq!(cb.on_epoch_end(&logs(2, 1.1), &vars()).unwrap(), Control::Continue);
    assert_eq!(cb.on_epoch_end(&logs(3, 1.2), &vars()).unwrap(), Control::Stop(StopReason::EarlyStopping));
}

#[test]
fn early_stopping_keeps_the_best_weights_when_asked() {
    let es = early_stopping::EarlyStopping::new("early_stopping".into(), val_loss(), 0.0, 1, true);
    let mut cb = Callbacks::of(vec![Box::new(es)]);
    let best = Variables { params: vec![7.0], state: Vec::new() };
    assert_eq!(cb.on_epoch_end(&logs(1, 1.0), &best).unwrap(), Control::Continue);
    assert_eq!(cb.on_epoch_end(&logs(2, 2.0), &vars()).unwrap(), Control::StopAndRestore(StopReason::EarlyStopping));
    assert_eq!(cb.best_weights(), Some(&best));
}

#[test]
fn plateau_multiplies_the_rate_and_respects_the_floor() {
    let mut cb = Callbacks::of(vec![plateau(1, 0, 0.03)]);
    cb.on_epoch_end(&logs(1, 1.0), &vars()).unwrap();
    cb.on_epoch_end(&logs(2, 1.0), &vars()).unwrap();
    assert_eq!(cb.learning_rate(0.1), 0.05);
    cb.on_epoch_end(&logs(3, 1.0), &vars()).unwrap();
    cb.on_epoch_end(&logs(4, 1.0), &vars()).unwrap();
    assert_eq!(cb.learning_rate(0.1), 0.03);
}

#[test]
fn target_stops_mid_epoch() {
    let target = stop_at_target::StopAtTarget::new("stop_at_target".into(), Monitor::ValAccuracy, 0.9);
    let mut cb = Callbacks::of(vec![Box::new(target)]);
    assert_eq!(cb.on_evaluation(&logs(1, 0.5)), Control::Stop(StopReason::TargetReached));
}

/// The state is keyed by name, so a resumed callback finds its own memory whatever the order
/// or number of the others.
#[test]
fn a_restored_callback_decides_as_the_original_would() {
    let make = || Callbacks::of(vec![plateau(2, 1, 0.0), stopping(3)]);
    let losses = [1.0, 1.1, 1.2, 0.9, 1.3, 1.4, 1.5, 1.6];
    let mut straight = make();
    let mut decisions = Vec::new();
    for (i, &l) in losses.iter().enumerate() {
        let control = straight.on_epoch_end(&logs(i as u64 + 1, l), &vars()).unwrap();
        decisions.push((control, straight.learning_rate(0.1)));
    }
    for cut in 1..losses.len() {
        let mut first = make();
        for (i, &l) in losses[..cut].iter().enumerate() {
            first.on_epoch_end(&logs(i as u64 + 1, l), &vars()).unwrap();
        }
        let state = first.state();
        assert!(state.contains_key("early_stopping") && state.contains_key("reduce_lr_on_plateau"), "{state:?}");
        // Restored in the other order: names, not positions, carry the memory.
        let mut resumed = Callbacks::of(vec![stopping(3), plateau(2, 1, 0.0)]);
        resumed.restore(&state, cut as u64, None).unwrap();
        for (i, &l) in losses.iter().enumerate().skip(cut) {
            let control = resumed.on_epoch_end(&logs(i as u64 + 1, l), &vars()).unwrap();
            assert_eq!(
                (control, resumed.learning_rate(0.1)),
                decisions[i],
                "resumed after {cut} epochs, epoch {}",
                i + 1
            );
        }
    }
}

#[test]
fn csv_columns_follow_the_first_row_and_a_resume_keeps_earlier_rows() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("log.csv");
    let csv = || Box::new(csv_logger::CsvLogger::new("csv_logger".into(), path.clone(), false)) as Box<dyn Callback>;
    let no_val = |epoch| Logs { val_loss: None, val_accuracy: None, ..logs(epoch, 0.0) };
    let mut cb = Callbacks::of(vec![csv()]);
    for e in 1..=3 {
        cb.on_epoch_end(&no_val(e), &vars()).unwrap();
    }
    let text = std::fs::read_to_string(&path).unwrap();
    assert_eq!(text.lines().next(), Some("epoch,accuracy,learning_rate,loss"));
    assert_eq!(text.lines().count(), 4);
    let state = cb.state();
    drop(cb);
    let mut cb = Callbacks::of(vec![csv()]);
    cb.restore(&state, 2, None).unwrap();
    cb.on_epoch_end(&no_val(3), &vars()).unwrap();
    let again = std::fs::read_to_string(&path).unwrap();
    assert_eq!(again, text, "epoch 3 is written once, after epochs 0 and 1");
}
