//! Every workspace member builds with no default features and with each of
//! its features alone (what `cargo hack check --each-feature` and crossbeam's
//! `ci/check-features.sh` do): a feature that forgets to enable what it uses
//! fails here rather than in a downstream build. `--all-features` is
//! clippy's step.

use std::collections::BTreeMap;

use cargo_metadata::Package;
use xshell::{Shell, cmd};

use crate::shell::{cargo, run};

/// The feature sets to build a package with: none, each feature alone, and
/// `default` when it is not one of those already.
fn combinations(features: &BTreeMap<String, Vec<String>>) -> Vec<Vec<String>> {
    let mut out: Vec<Vec<String>> = vec![Vec::new()];
    let alone = features.keys().filter(|f| *f != "default");
    out.extend(alone.map(|f| vec![f.clone()]));
    if let Some(default) = features.get("default") {
        let mut default = default.clone();
        default.sort();
        if !out.contains(&default) {
            out.push(default);
        }
    }
    out
}

/// `cargo check` of each member with each of its combinations; true when all
/// built. Goes on after a failure and names every combination that failed.
pub(crate) fn check_each(sh: &Shell, members: &[Package]) -> bool {
    let cargo = cargo();
    let mut failed = Vec::new();
    let mut count = 0;
    for package in members {
        let name = package.name.as_str();
        for features in combinations(&package.features) {
            let chosen = if features.is_empty() {
                Vec::new()
            } else {
                vec!["--features".to_owned(), features.join(",")]
            };
            count += 1;
            let check = cmd!(
                sh,
                "{cargo} check --quiet -p {name} --no-default-features {chosen...}"
            );
            if !run(check) {
                failed.push(format!("{} [{}]", package.name, features.join(",")));
            }
        }
    }
    if failed.is_empty() {
        eprintln!("xtask: {count} feature combinations build");
    } else {
        eprintln!(
            "xtask: {} of {count} feature combinations fail to build: {}",
            failed.len(),
            failed.join("; ")
        );
    }
    failed.is_empty()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn features(list: &[(&str, &[&str])]) -> BTreeMap<String, Vec<String>> {
        list.iter()
            .map(|(name, enables)| {
                let enables = enables.iter().map(|s| (*s).to_owned()).collect();
                ((*name).to_owned(), enables)
            })
            .collect()
    }

    #[test]
    fn none_then_each_alone_then_a_default_that_is_neither() {
        let demo = features(&[
            ("default", &["nixl", "loopback"]),
            ("loopback", &["dep:backend-loopback"]),
            ("nixl", &["dep:backend-nixl"]),
        ]);
        assert_eq!(
            combinations(&demo),
            [
                vec![],
                vec!["loopback"],
                vec!["nixl"],
                vec!["loopback", "nixl"]
            ]
        );
    }

    #[test]
    fn a_default_equal_to_none_or_to_one_feature_is_not_built_twice() {
        let core = features(&[("default", &[]), ("conformance", &["dep:futures"])]);
        assert_eq!(combinations(&core), [vec![], vec!["conformance"]]);
        let demo = features(&[("default", &["loopback"]), ("loopback", &[])]);
        assert_eq!(combinations(&demo), [vec![], vec!["loopback"]]);
    }

    #[test]
    fn a_crate_without_features_is_built_once() {
        assert_eq!(combinations(&BTreeMap::new()), [Vec::<String>::new()]);
    }
}
