//! The merge layer: decoded models composed into one.
//!
//! What the caller asks ([`options`]); the plan ([`plan`]: edges, checks, exposure,
//! pruning, adapters); the final name of every value and node ([`final_names`]); the walk
//! that renames them ([`rename`]); weights stored once ([`dedupe`]); the merged graph laid
//! out ([`assemble`]); opset imports ([`opsets`]); metadata ([`metadata`]); the stage map files keep ([`stage_map`]); onnx.compose's
//! rules where they differ ([`onnx_rules`]); the entry point that runs these steps in
//! order ([`compose`]); and whether a batch's rows stay apart in the result ([`rows`]).
//!
//! The one rule: it names the codec layer (and the bottom modules), never storage or the
//! pipeline: models come in decoded, weights still in their files are read through the
//! reader the pipeline hands in ([`options::Options::read_weight`]), and the result goes
//! out as a [`compose::Composition`].
pub mod assemble;
pub mod compose;
pub mod dedupe;
pub mod final_names;
pub mod metadata;
pub mod onnx_rules;
pub mod opsets;
pub mod options;
pub mod plan;
pub mod rename;
pub mod rows;
pub mod stage_map;
#[cfg(test)]
pub(crate) mod testing;
