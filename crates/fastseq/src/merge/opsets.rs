//! Opset imports and IR versions of the merged model.
use std::collections::BTreeMap;

use crate::codec::proto::{ModelProto, OperatorSetIdProto};
use crate::error::{Error, Result};

/// "ai.onnx" and "" are the same domain.
pub fn normalize_domain(domain: &str) -> &str {
    if domain == "ai.onnx" {
        ""
    } else {
        domain
    }
}

fn shown(domain: &str) -> &str {
    if domain.is_empty() {
        "ai.onnx"
    } else {
        domain
    }
}

/// Merges the opset imports of all models per domain. Two versions of one domain are an
/// error naming every model and the version it imports.
pub fn merge_opsets(models: &[ModelProto], labels: &[String]) -> Result<Vec<OperatorSetIdProto>> {
    // domain -> version -> (index, label) of the models importing it
    type Importers<'a> = BTreeMap<i64, Vec<(usize, &'a str)>>;
    let mut seen: BTreeMap<String, Importers> = BTreeMap::new();
    for (k, (model, label)) in models.iter().zip(labels).enumerate() {
        for op in &model.opset_import {
            let domain = normalize_domain(op.domain.as_deref().unwrap_or("")).to_string();
            let version = op.version.unwrap_or(0);
            let who = seen.entry(domain).or_default().entry(version).or_default();
            // A model may import one domain twice ("" and "ai.onnx", or the same entry
            // twice, as skl2onnx writes): it is named once.
            if who.last().is_none_or(|(last, _)| *last != k) {
                who.push((k, label));
            }
        }
    }
    let mut merged = Vec::with_capacity(seen.len());
    let mut conflicts = Vec::new();
    for (domain, versions) in &seen {
        if versions.len() > 1 {
            let parts: Vec<String> = versions
                .iter()
                .map(|(v, who)| format!("{v} in {}", who.iter().map(|(_, l)| *l).collect::<Vec<_>>().join(", ")))
                .collect();
            conflicts.push(format!("domain '{}': {}", shown(domain), parts.join("; ")));
        }
        let version = *versions.keys().next_back().expect("non-empty");
        merged.push(OperatorSetIdProto { domain: Some(domain.clone()), version: Some(version), ..Default::default() });
    }
    if !conflicts.is_empty() {
        // Neutral on purpose: how to convert depends on the entry point (ONNXSequential,
        // compose, merge_models, the CLI), so the Python layer adds the hint.
        return Err(Error::opset(format!("the models import different opset versions: {}", conflicts.join(" | "))));
    }
    Ok(merged)
}

/// The merged IR version: the highest among the models.
pub fn merged_ir_version(models: &[ModelProto]) -> i64 {
    models.iter().filter_map(|m| m.ir_version).max().unwrap_or(crate::codec::model::MAX_IR_VERSION)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn model(ops: &[(&str, i64)]) -> ModelProto {
        ModelProto {
            opset_import: ops
                .iter()
                .map(|(d, v)| OperatorSetIdProto {
                    domain: Some(d.to_string()),
                    version: Some(*v),
                    ..Default::default()
                })
                .collect(),
            ..Default::default()
        }
    }

    #[test]
    fn same_versions_merge_and_ai_onnx_is_the_default_domain() {
        let ms = [model(&[("", 17)]), model(&[("ai.onnx", 17), ("ai.onnx.ml", 3)])];
        let labels = vec!["a".to_string(), "b".to_string()];
        let merged = merge_opsets(&ms, &labels).unwrap();
        assert_eq!(merged.len(), 2);
        assert_eq!(merged[0].version, Some(17));
        assert_eq!(merged[1].domain.as_deref(), Some("ai.onnx.ml"));
    }

    #[test]
    fn differing_versions_name_models_and_versions() {
        let ms = [model(&[("", 13)]), model(&[("", 17)])];
        let labels = vec!["resize.onnx".to_string(), "head.onnx".to_string()];
        let err = merge_opsets(&ms, &labels).unwrap_err();
        assert_eq!(err.kind, crate::error::Kind::Opset);
        assert!(err.message.contains("13 in resize.onnx; 17 in head.onnx"), "{}", err.message);
        assert!(!err.message.contains("auto_ir_version_conversion"), "{}", err.message);
        // A model importing the domain twice is named once.
        let ms = [model(&[("", 13), ("", 13)]), model(&[("", 17), ("ai.onnx", 17)])];
        let err = merge_opsets(&ms, &labels).unwrap_err();
        assert!(err.message.ends_with("13 in resize.onnx; 17 in head.onnx"), "{}", err.message);
    }
}
