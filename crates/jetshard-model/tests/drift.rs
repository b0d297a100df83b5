//! Fails when the library's owner states and the model's drift apart: the variants of the
//! owner's `Phase` (`owner/phase.rs`) and `StepDown` (`owner/settle.rs`) are read from the
//! source and compared with what the model names (`Phase::code_name`, `STEP_DOWNS_MODELLED`,
//! `STEP_DOWNS_LEFT_OUT`). A phase or a reason to step down added to (or removed from) the
//! library fails this test until the model (and docs/MODEL.md) says what becomes of it.

use std::collections::BTreeSet;

use jetshard_model::{ISOLATED_DEATHS, Phase, STEP_DOWNS_LEFT_OUT, STEP_DOWNS_MODELLED};

const PHASE_RS: &str = include_str!("../../jetshard/src/runtime/owner/phase.rs");
const SETTLE_RS: &str = include_str!("../../jetshard/src/runtime/owner/settle.rs");

/// The variant names of the enum declared by the line starting with `header`.
fn variants(source: &str, header: &str) -> BTreeSet<String> {
    let mut lines = source.lines().skip_while(|l| !l.starts_with(header));
    assert!(lines.next().is_some(), "no `{header}` in the source");
    let mut names = BTreeSet::new();
    for line in lines.take_while(|l| *l != "}") {
        // A variant starts at the enum's indentation with a capital letter (`Name,`,
        // `Name(..)`, `Name {`); comments, attributes and fields do not.
        let Some(rest) = line.strip_prefix("    ") else {
            continue;
        };
        if !rest.starts_with(|c: char| c.is_ascii_uppercase()) {
            continue;
        }
        let name: String = rest
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
            .collect();
        names.insert(name);
    }
    assert!(!names.is_empty(), "no variants read after `{header}`");
    names
}

#[test]
fn the_model_has_the_owners_phases() {
    let code = variants(PHASE_RS, "pub(super) enum Phase<");
    let model: BTreeSet<String> = Phase::all()
        .iter()
        .map(|p| p.code_name().to_owned())
        .collect();
    assert_eq!(
        code, model,
        "owner/phase.rs's `Phase` and the model's phases differ"
    );
}

#[test]
fn the_model_takes_or_leaves_out_each_reason_to_step_down() {
    let code = variants(SETTLE_RS, "pub(crate) enum StepDown");
    let modelled: BTreeSet<String> = STEP_DOWNS_MODELLED.iter().map(|s| s.to_string()).collect();
    let left_out: BTreeSet<String> = STEP_DOWNS_LEFT_OUT
        .iter()
        .map(|(s, _)| s.to_string())
        .collect();
    assert!(modelled.is_disjoint(&left_out));
    let model: BTreeSet<String> = modelled.union(&left_out).cloned().collect();
    assert_eq!(
        code, model,
        "owner/settle.rs's `StepDown` and the model's list differ"
    );
}

#[test]
fn a_phase_added_to_the_library_is_noticed() {
    let added = PHASE_RS.replacen(
        "    Standby,\n",
        "    Standby,\n    /// A new phase.\n    Draining(u8),\n",
        1,
    );
    assert_ne!(
        added, PHASE_RS,
        "the phase list's shape changed: update this test"
    );
    let code = variants(&added, "pub(super) enum Phase<");
    assert!(code.contains("Draining"));
    assert_ne!(code, variants(PHASE_RS, "pub(super) enum Phase<"));
}

#[test]
fn the_model_gives_a_command_up_after_as_many_isolated_deaths_as_the_library() {
    let line = SETTLE_RS
        .lines()
        .find(|l| l.starts_with("pub(crate) const ISOLATED_DEATHS: u32 = "))
        .expect("owner/settle.rs declares ISOLATED_DEATHS");
    let value: u8 = line
        .trim_start_matches("pub(crate) const ISOLATED_DEATHS: u32 = ")
        .trim_end_matches(';')
        .parse()
        .expect("a number");
    assert_eq!(
        value, ISOLATED_DEATHS,
        "owner/settle.rs's ISOLATED_DEATHS and the model's differ"
    );
}
