//! The plan of a composition, read from the stages' own names before anything is renamed:
//! which output feeds which input ([`edges`]), the checks at each edge and the adapters they
//! call for ([`adapters`]), what the merged graph exposes ([`exposure`]), and what no
//! requested output needs ([`prune`]); [`build`] runs these in order into the [`parts`] of
//! a plan.
//!
//! Stages are taken in the given order and every edge goes from an earlier stage to a later
//! one, so that concatenating the stages' nodes in order keeps the graph topologically sorted.
pub mod adapters;
pub mod build;
pub mod edges;
pub mod exposure;
pub mod parts;
pub mod prune;

#[cfg(test)]
mod tests {
    use crate::merge::testing::*;

    #[test]
    fn edge_errors_name_stages_tensors_and_near_misses() {
        let three = || vec![distinct(1.0), distinct(2.0), distinct(3.0)];
        let loop_ = graph_opts(vec![edge(0, "y", 1, "x"), edge(1, "y", 2, "x"), edge(2, "y", 0, "x")], &[]);
        let msg = composition_error(three(), &loop_);
        assert!(msg.contains("the edges form a loop: m0.onnx -> m1.onnx -> m2.onnx -> m0.onnx"), "{msg}");
        let back = graph_opts(vec![edge(2, "y", 0, "x")], &[]);
        assert!(composition_error(three(), &back).contains("m2.onnx comes after m0.onnx in the stage order"));
        let msg = composition_error(three(), &graph_opts(vec![edge(0, "y", 7, "x")], &[]));
        assert!(msg.contains("there is no stage 7 (3 stages given)"), "{msg}");
        let msg = composition_error(three(), &graph_opts(vec![edge(0, "Y", 1, "x")], &[]));
        assert!(
            msg.contains("edge 0 (m0.onnx.Y -> m1.onnx.x): 'Y' is not an output of m0.onnx (did you mean 'y'?)"),
            "{msg}"
        );
        let twice = graph_opts(vec![edge(0, "y", 2, "x"), edge(1, "y", 2, "x")], &[]);
        let msg = composition_error(three(), &twice);
        assert!(msg.contains("input 'x' of m2.onnx is fed twice, by 'y' of m0.onnx and by 'y' of m1.onnx"), "{msg}");
        let opts = Options {
            edges: Some(vec![edge(0, "y", 1, "x")]),
            graph_inputs: Some(vec![("x".into(), vec![(1, "x".into())])]),
            ..Default::default()
        };
        assert!(composition_error(three(), &opts).contains("is fed twice, by this graph input and by edge 0"));
        let msg = composition_error(three(), &graph_opts(vec![], &[("a", 0, "y"), ("a", 1, "y")]));
        assert!(msg.contains("the name 'a' is exposed twice"), "{msg}");
        let msg = composition_error(three(), &graph_opts(vec![], &[("a", 0, "yy")]));
        assert!(msg.contains("graph output 'a': 'yy' is not an output of m0.onnx (did you mean 'y'?)"), "{msg}");
    }

    #[test]
    fn mismatches_say_which_adapter_fixes_them_and_adapt_inserts_it() {
        let pair = || vec![scale(1), with_shape(scale(11), &[2, 4], &[2, 4], 11)];
        let opts = graph_opts(vec![edge(0, "y", 1, "x")], &[("out", 1, "y")]);
        let msg = composition_error(pair(), &opts);
        assert!(msg.contains("output 'y' is float but input 'x' expects double; pass adapt=True"), "{msg}");
        assert!(msg.ends_with("to insert a Cast to double"), "{msg}");
        let c = compose(pair(), &labels(2), &Options { adapt: Adapt::All, ..opts.clone() }).unwrap();
        let g = c.model.graph.unwrap();
        let cast = node_at(&g, 2);
        assert_eq!((cast.op_type.as_deref(), cast.input.clone()), (Some("Cast"), vec!["y".to_string()]));
        assert_eq!(node_at(&g, 3).input[0], cast.output[0]);
        assert_eq!(c.report.adapters, [(0, "Cast to double".to_string())]);
        assert_eq!(c.origins.nodes, [(0, 2), (2, 5)]);

        // A missing leading axis: an Unsqueeze (axes as an input from opset 13).
        let batch = || vec![with_shape(scale(1), &[2, 4], &[4], 1), with_shape(scale(1), &[1, 4], &[1, 4], 1)];
        let msg = composition_error(batch(), &opts);
        assert!(msg.contains("output 'y' has shape [4] but input 'x' expects [1, 4]"), "{msg}");
        assert!(msg.ends_with("insert a Unsqueeze of axis 0"), "{msg}");
        let adapt = Options { adapt: Adapt::Edges(vec![0]), ..opts.clone() };
        let g = compose(batch(), &labels(2), &adapt).unwrap().model.graph.unwrap();
        let unsqueeze = node_at(&g, 2);
        assert_eq!(unsqueeze.op_type.as_deref(), Some("Unsqueeze"));
        assert!(g.initializer.iter().any(|t| t.name.as_deref() == Some(unsqueeze.input[1].as_str())));
        // An extra leading axis of size 1: a Squeeze (an attribute before opset 13).
        let mut extra = vec![with_shape(scale(1), &[2, 4], &[1, 4], 1), with_shape(scale(1), &[4], &[4], 1)];
        for m in &mut extra {
            m.opset_import[0].version = Some(11);
        }
        let msg = composition_error(extra.clone(), &opts);
        assert!(msg.ends_with("insert a Squeeze of axis 0"), "{msg}");
        let c = compose(extra, &labels(2), &adapt).unwrap();
        let squeeze = node_at(c.model.graph.as_ref().unwrap(), 2);
        assert_eq!((squeeze.op_type.as_deref(), squeeze.input.len()), (Some("Squeeze"), 1));
        assert_eq!(squeeze.attribute[0].ints, [0]);
        let out_of_range = Options { adapt: Adapt::Edges(vec![3]), ..opts.clone() };
        assert!(composition_error(batch(), &out_of_range).contains("adapt lists edge 3, but there is 1 edge"));
        // Two different static sizes: no adapter helps, both sides are named.
        let wide = vec![scale(1), with_shape(scale(1), &[2, 5], &[2, 5], 1)];
        let msg = composition_error(wide, &adapt);
        assert!(
            msg.contains("output 'y' has shape [2, 4] but input 'x' expects [2, 5]") && !msg.contains("adapt"),
            "{msg}"
        );
    }

    #[test]
    fn symbolic_dims_joined_by_an_edge_take_one_name() {
        let (mut a, mut b) = (scale(1), scale(1));
        symbolic(&mut a, "batch", "batch");
        symbolic(&mut b, "N", "N");
        let opts = graph_opts(vec![edge(0, "y", 1, "x")], &[("out", 1, "y")]);
        let g = compose(vec![a, b], &labels(2), &opts).unwrap().model.graph.unwrap();
        let dim = |vi: &ValueInfoProto| match vi.r#type.as_ref().unwrap().value.as_ref().unwrap() {
            type_proto::Value::TensorType(t) => t.shape.as_ref().unwrap().dim[0].value.clone(),
            _ => None,
        };
        assert_eq!(dim(&g.output[0]), Some(Dim::DimParam("batch".into())));
    }

    #[test]
    fn pruning_leaves_out_what_no_output_needs() {
        let models = vec![distinct(1.0), distinct(2.0), distinct(3.0)];
        let edges = vec![edge(0, "y", 1, "x"), edge(0, "y", 2, "x")];
        let c = compose(models.clone(), &labels(3), &graph_opts(edges.clone(), &[("left", 1, "y")])).unwrap();
        let g = c.model.graph.unwrap();
        assert_eq!(g.node.len(), 4);
        assert_eq!(g.initializer.len(), 2);
        assert_eq!(c.report.pruned.stages, [2]);
        assert_eq!((c.report.pruned.nodes, c.report.pruned.initializers), (2, 1));
        assert_eq!(c.report.unused_outputs, [(2, "y".to_string())]);
        assert_eq!(c.origins.nodes, [(0, 2), (2, 4), (4, 4)]);
        // A chain whose tail nothing needs: pruning walks back through it.
        let chain = graph_opts(vec![edge(0, "y", 1, "x"), edge(1, "y", 2, "x")], &[("first", 0, "y")]);
        let c = compose(models.clone(), &labels(3), &chain).unwrap();
        assert_eq!(c.report.pruned.stages, [1, 2]);
        assert_eq!(c.model.graph.unwrap().node.len(), 2);
        // Off on request: everything stays.
        let keep = Options { prune: Some(false), ..graph_opts(edges, &[("left", 1, "y")]) };
        assert_eq!(compose(models, &labels(3), &keep).unwrap().model.graph.unwrap().node.len(), 6);
    }

    #[test]
    fn the_linear_form_is_converted_to_edges_in_one_place() {
        let (edges, wheres) = crate::merge::plan::edges::linear_edges(&[scale(1), scale(1)], &labels(2), None).unwrap();
        assert_eq!(edges, [edge(0, "y", 1, "x")]);
        assert_eq!(wheres, ["joint 0 (m0.onnx -> m1.onnx)"]);
        // io_maps and edges together are refused.
        let both = Options { io_maps: Some(vec![vec![]]), edges: Some(vec![]), ..Default::default() };
        assert!(composition_error(vec![scale(1), scale(1)], &both).contains("not both"));
    }
}
