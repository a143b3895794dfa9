//! Model metadata (`ModelProto.metadata_props`): key/value pairs added after composition.
use crate::codec::proto::{ModelProto, StringStringEntryProto};
use crate::merge::options::Rules;
use crate::merge::stage_map;

/// Whether a stage's metadata entry goes into the merged model: under fastseq's rules every
/// entry but a stage map, which tells the stages of that model's own nodes, not of the
/// merged graph (a merged model written to a file gets its own); under onnx.compose's, every
/// entry, as onnx.compose keeps them.
pub fn kept_in_merge(key: &str, rules: Rules) -> bool {
    rules == Rules::OnnxCompose || key != stage_map::KEY
}

/// `existing` metadata pairs with `pairs` set in them. Each key appears once: `onnx.checker`
/// refuses repeated keys, and ONNX Runtime reads only the last entry of one. A key keeps the
/// position of its first entry and takes its last value, whether that value comes from
/// `existing` or from `pairs` (kornia's `add_metadata` does the same). The one rule for
/// metadata set on a model, whether the core holds it or Python does (`_core.merge_metadata`).
pub fn merged(
    existing: impl IntoIterator<Item = (String, String)>,
    pairs: &[(String, String)],
) -> Vec<(String, String)> {
    let mut entries: Vec<(String, String)> = Vec::new();
    for (key, value) in existing.into_iter().chain(pairs.iter().cloned()) {
        match entries.iter_mut().find(|(k, _)| *k == key) {
            Some(entry) => entry.1 = value,
            None => entries.push((key, value)),
        }
    }
    entries
}

/// A copy of `model` with `pairs` set in its `metadata_props` (see [`merged`]). The copy
/// shares nodes and weights with `model` (reference-counted slices): nothing large is copied.
pub fn with_metadata(model: &ModelProto, pairs: &[(String, String)]) -> ModelProto {
    let mut out = model.clone();
    let existing =
        out.metadata_props.iter().map(|p| (p.key.clone().unwrap_or_default(), p.value.clone().unwrap_or_default()));
    out.metadata_props = merged(existing.collect::<Vec<_>>(), pairs)
        .into_iter()
        .map(|(k, v)| StringStringEntryProto { key: Some(k), value: Some(v), ..Default::default() })
        .collect();
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(k: &str, v: &str) -> StringStringEntryProto {
        StringStringEntryProto { key: Some(k.into()), value: Some(v.into()), ..Default::default() }
    }

    fn pairs(m: &ModelProto) -> Vec<(String, String)> {
        m.metadata_props.iter().map(|p| (p.key.clone().unwrap(), p.value.clone().unwrap())).collect()
    }

    #[test]
    fn keys_keep_their_first_position_and_last_value() {
        let model = ModelProto {
            metadata_props: vec![entry("a", "1"), entry("b", "2"), entry("a", "3")],
            ..Default::default()
        };
        let out =
            with_metadata(&model, &[("c".into(), "4".into()), ("b".into(), "5".into()), ("c".into(), "6".into())]);
        let want: Vec<(String, String)> =
            [("a", "3"), ("b", "5"), ("c", "6")].iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        assert_eq!(pairs(&out), want);
        // The original is not changed.
        assert_eq!(model.metadata_props.len(), 3);
    }

    #[test]
    fn no_pairs_only_merges_repeated_keys() {
        let model = ModelProto { metadata_props: vec![entry("k", "x")], ..Default::default() };
        assert_eq!(pairs(&with_metadata(&model, &[])), vec![("k".to_string(), "x".to_string())]);
    }
}
