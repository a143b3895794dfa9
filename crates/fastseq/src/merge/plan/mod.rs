//! The plan of a composition, read from the stages' own names before anything is renamed.
//!
//! In the graph form, the caller's wiring is checked in the caller's terms and the stages
//! are put in graph order first ([`wiring`], [`order`]). Then [`build`] makes the [`parts`]
//! of a plan: which output feeds which input ([`edges`]), the checks at each edge and the
//! adapters they call for ([`adapters`]), what the merged graph exposes ([`exposure`]), and
//! what no requested output needs ([`prune`]). The plan is handed back ([`view`]).
//!
//! Every edge goes from an earlier stage to a later one in graph order, so that laying the
//! stages' nodes end to end keeps the merged graph topologically sorted.
pub mod adapters;
pub mod build;
pub mod edges;
pub mod exposure;
pub mod order;
pub mod parts;
pub mod prune;
pub mod view;
pub mod wiring;

#[cfg(test)]
mod tests {
    use crate::merge::testing::*;

    #[test]
    fn wiring_errors_use_the_callers_keys_and_names() {
        let three = || vec![distinct(1.0), distinct(2.0), distinct(3.0)];
        let error = |opts: &Options| composition_error(three(), opts);
        let circle = graph_opts(vec![edge(0, "y", 1, "x"), edge(1, "y", 2, "x"), edge(2, "y", 0, "x")], &[]);
        assert_eq!(error(&circle), "edges: the edges make a cycle: m0.onnx -> m1.onnx -> m2.onnx -> m0.onnx");
        let itself = graph_opts(vec![edge(1, "y", 1, "x")], &[]);
        assert_eq!(error(&itself), "edges: the edges make a cycle: m1.onnx -> m1.onnx");
        assert_eq!(
            error(&graph_opts(vec![edge(0, "y", 7, "x")], &[])),
            "edges[0]: there is no stage 7 (3 stages given)"
        );
        assert_eq!(
            error(&graph_opts(vec![edge(0, "y", 1, "x"), edge(0, "Y", 2, "x")], &[])),
            "edges[1]: 'm0.onnx.Y' is not an output of m0.onnx (did you mean 'y'?)"
        );
        assert_eq!(
            error(&graph_opts(vec![edge(0, "y", 1, "X")], &[])),
            "edges[0]: 'm1.onnx.X' is not an input of m1.onnx (did you mean 'x'?)"
        );
        let twice = graph_opts(vec![edge(0, "y", 2, "x"), edge(1, "y", 2, "x")], &[]);
        assert_eq!(
            error(&twice),
            "edges[1]: 'm2.onnx.x' is fed twice: by edges[0] (m0.onnx.y -> m2.onnx.x) and by m1.onnx.y -> m2.onnx.x"
        );
        let input_too = Options {
            edges: Some(vec![edge(0, "y", 1, "x")]),
            graph_inputs: Some(vec![("img".into(), vec![(2, "x".into()), (1, "x".into())])]),
            ..Default::default()
        };
        assert_eq!(
            error(&input_too),
            "inputs.img[1]: 'm1.onnx.x' is fed twice: by edges[0] (m0.onnx.y -> m1.onnx.x) and by graph input 'img'"
        );
        assert_eq!(
            error(&graph_opts(vec![], &[("a", 0, "y"), ("a", 1, "y")])),
            "outputs[1]: the output name 'a' is taken by outputs[0]"
        );
        assert_eq!(
            error(&graph_opts(vec![], &[("a", 0, "y"), ("b", 1, "yy")])),
            "outputs[1]: 'm1.onnx.yy' is not an output of m1.onnx (did you mean 'y'?)"
        );
        // Default outputs are named like the caller's: 'y' of the one stage is 'y'.
        let both = Options {
            edges: Some(vec![]),
            graph_inputs: Some(vec![("y".into(), vec![(0, "x".into())])]),
            ..Default::default()
        };
        let msg = composition_error(vec![distinct(1.0)], &both);
        assert_eq!(msg, "inputs: 'y' is both a graph input and a graph output");
        // Names are checked before the edges make a circle, as the caller wrote them.
        let bad_and_circle = graph_opts(vec![edge(0, "y", 1, "x"), edge(1, "y", 0, "z")], &[]);
        assert!(error(&bad_and_circle).starts_with("edges[1]: 'm0.onnx.z' is not an input"));
    }

    #[test]
    fn stages_given_in_any_order_are_merged_in_graph_order() {
        // c <- b <- a, given as [c, b, a].
        let names = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        let given = vec![distinct(3.0), distinct(2.0), distinct(1.0)];
        let backwards = Options { edges: Some(vec![edge(1, "y", 0, "x"), edge(2, "y", 1, "x")]), ..Default::default() };
        let c = compose(given, &names(&["c", "b", "a"]), &backwards).unwrap();
        assert_eq!(c.labels, ["a", "b", "c"]);
        let stages: Vec<(&str, usize)> = c.plan.stages.iter().map(|s| (s.label.as_str(), s.given)).collect();
        assert_eq!(stages, [("a", 2), ("b", 1), ("c", 0)]);
        let edges: Vec<(&str, &str, usize)> =
            c.plan.edges.iter().map(|e| (e.from.as_str(), e.to.as_str(), e.index)).collect();
        assert_eq!(edges, [("b", "c", 0), ("a", "b", 1)], "edges stay in the caller's order");
        // The same model as the stages given forward.
        let forward = Options { edges: Some(vec![edge(1, "y", 2, "x"), edge(0, "y", 1, "x")]), ..Default::default() };
        let f = compose(vec![distinct(1.0), distinct(2.0), distinct(3.0)], &names(&["a", "b", "c"]), &forward).unwrap();
        assert_eq!(c.model, f.model);
        assert_eq!(c.origins.nodes, [(0, 2), (2, 4), (4, 6)]);
        // Stable: a stage no edge orders keeps its place.
        let (m, l) = (vec![distinct(1.0), distinct(2.0), distinct(3.0)], names(&["p", "q", "r"]));
        let c = compose(m, &l, &Options { edges: Some(vec![edge(2, "y", 0, "x")]), ..Default::default() }).unwrap();
        assert_eq!(c.labels, ["q", "r", "p"]);
        assert_plan_is_the_model(&c);
    }

    /// The plan's exposed inputs and outputs are exactly the merged model's.
    fn assert_plan_is_the_model(c: &crate::merge::compose::Composition) {
        let g = c.model.graph.as_ref().unwrap();
        let planned: Vec<&str> = c.plan.inputs.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(planned, names(&g.input), "inputs");
        let planned: Vec<&str> = c.plan.outputs.iter().map(|(n, ..)| n.as_str()).collect();
        assert_eq!(planned, names(&g.output), "outputs");
    }

    #[test]
    fn the_plan_exposes_what_the_merged_model_has() {
        let ab = || vec!["a".to_string(), "b".to_string()];
        let pair = || vec![join("Add", &["x", "z"]), distinct(1.0)];
        // a(x, z), b(x), with a graph input named 'a.x' feeding a.z: a.x itself is unfed,
        // and 'a.x' is taken, so it is exposed as 'a.x_1'.
        let opts = Options {
            edges: Some(vec![]),
            graph_inputs: Some(vec![("a.x".into(), vec![(0, "z".into())])]),
            ..Default::default()
        };
        let c = compose(pair(), &ab(), &opts).unwrap();
        assert_plan_is_the_model(&c);
        let feeds = |v: &[(&str, &[(&str, &str)])]| -> Vec<(String, Vec<(String, String)>)> {
            v.iter()
                .map(|(n, f)| (n.to_string(), f.iter().map(|(s, i)| (s.to_string(), i.to_string())).collect()))
                .collect()
        };
        assert_eq!(c.plan.inputs, feeds(&[("a.x", &[("a", "z")]), ("a.x_1", &[("a", "x")]), ("b.x", &[("b", "x")])]));
        assert_eq!(c.plan.outputs, [("a.y".into(), "a".into(), "y".into()), ("b.y".into(), "b".into(), "y".into())]);
        // One input feeding both stages.
        let shared = Options {
            edges: Some(vec![]),
            graph_inputs: Some(vec![("image".into(), vec![(0, "x".into()), (1, "x".into())])]),
            ..Default::default()
        };
        let c = compose(pair(), &ab(), &shared).unwrap();
        assert_plan_is_the_model(&c);
        assert_eq!(c.plan.inputs, feeds(&[("image", &[("a", "x"), ("b", "x")]), ("z", &[("a", "z")])]));
        // Two heads on one stage, the second exposed under a name of the caller's.
        let heads = graph_opts(vec![edge(0, "y", 1, "x"), edge(0, "y", 2, "x")], &[("y", 1, "y"), ("aux", 2, "y")]);
        let c = compose(vec![distinct(1.0), distinct(2.0), distinct(3.0)], &labels(3), &heads).unwrap();
        assert_plan_is_the_model(&c);
        assert_eq!(c.plan.inputs, feeds(&[("x", &[("m0.onnx", "x")])]));
        // The linear form: its joints are the plan's edges.
        let c = compose(vec![scale(1), scale(1)], &labels(2), &Options::default()).unwrap();
        assert_plan_is_the_model(&c);
        assert!(!c.plan.graph_form);
        let e = &c.plan.edges[0];
        assert_eq!(
            (e.from.as_str(), e.output.as_str(), e.to.as_str(), e.input.as_str()),
            ("m0.onnx", "y", "m1.onnx", "x")
        );
        assert_eq!(c.plan.outputs, [("y".into(), "m1.onnx".into(), "y".into())]);
    }

    #[test]
    fn mismatches_say_which_adapter_fixes_them_and_adapt_inserts_it() {
        let pair = || vec![scale(1), with_shape(scale(11), &[2, 4], &[2, 4], 11)];
        let opts = graph_opts(vec![edge(0, "y", 1, "x")], &[("out", 1, "y")]);
        let msg = composition_error(pair(), &opts);
        assert!(msg.contains("output 'y' is float but input 'x' expects double; pass adapt=True"), "{msg}");
        assert!(msg.ends_with("to insert a Cast to double"), "{msg}");
        let c = compose(pair(), &labels(2), &Options { adapt: Adapt::All, ..opts.clone() }).unwrap();
        let g = c.model.graph.clone().unwrap();
        let cast = node_at(&g, 2);
        assert_eq!((cast.op_type.as_deref(), cast.input.clone()), (Some("Cast"), vec!["y".to_string()]));
        assert_eq!(node_at(&g, 3).input[0], cast.output[0]);
        assert_eq!(c.report.adapters, [(0, "Cast to double".to_string())]);
        assert_eq!(c.plan.adapters, c.report.adapters);
        assert_plan_is_the_model(&c);
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

    /// `m` with the shapes of its input and output replaced: ints are sizes, other text names.
    fn shaped(mut m: ModelProto, input: &[&str], output: &[&str]) -> ModelProto {
        let g = m.graph.as_mut().unwrap();
        for (vi, dims) in [(&mut g.input[0], input), (&mut g.output[0], output)] {
            let Some(type_proto::Value::TensorType(t)) = vi.r#type.as_mut().unwrap().value.as_mut() else { panic!() };
            t.shape.as_mut().unwrap().dim = dims
                .iter()
                .map(|d| tensor_shape_proto::Dimension {
                    value: Some(d.parse().map(Dim::DimValue).unwrap_or_else(|_| Dim::DimParam(d.to_string()))),
                    denotation: None,
                    ..Default::default()
                })
                .collect();
        }
        m
    }

    fn shape_of(vi: &ValueInfoProto) -> Vec<String> {
        let Some(type_proto::Value::TensorType(t)) = vi.r#type.as_ref().unwrap().value.as_ref() else { panic!() };
        t.shape
            .as_ref()
            .unwrap()
            .dim
            .iter()
            .map(|d| match d.value.as_ref() {
                Some(Dim::DimValue(v)) => v.to_string(),
                Some(Dim::DimParam(p)) => p.clone(),
                None => "?".into(),
            })
            .collect()
    }

    #[test]
    fn static_sizes_cross_edges_into_symbolic_dims() {
        // A backbone's [batch, 1000] into a softmax declared [N, d1] -> [N, d1]: the
        // softmax's output is [batch, 1000], and so is a topk's input after it.
        let models = vec![
            shaped(scale(1), &["batch", "3"], &["batch", "1000"]),
            shaped(scale(1), &["N", "d1"], &["N", "d1"]),
            shaped(scale(1), &["N", "d1"], &["N", "5"]),
        ];
        let opts = graph_opts(vec![edge(0, "y", 1, "x"), edge(1, "y", 2, "x")], &[("p", 1, "y"), ("top", 2, "y")]);
        let g = compose(models, &labels(3), &opts).unwrap().model.graph.unwrap();
        assert_eq!(shape_of(&g.output[0]), ["batch", "1000"]);
        assert_eq!(shape_of(&g.output[1]), ["batch", "5"]);
        // Backwards too: a static size that a later stage needs fixes the pipeline's input.
        let models = vec![shaped(scale(1), &["N", "C"], &["N", "C"]), shaped(scale(1), &["b", "3"], &["b", "7"])];
        let opts = graph_opts(vec![edge(0, "y", 1, "x")], &[("out", 1, "y")]);
        let g = compose(models, &labels(2), &opts).unwrap().model.graph.unwrap();
        assert_eq!(shape_of(&g.input[0]), ["N", "3"]);
        assert_eq!(shape_of(&g.output[0]), ["N", "7"]);
        // A size reaching a class through a later member sizes its root too: to_float's
        // [N, d1, d2, d3] -> layout's [N, H, W, C] -> [N, C, H, W] -> grayscale's [N, 3, H, W].
        let models = vec![
            shaped(scale(1), &["N", "d1", "d2", "d3"], &["N", "d1", "d2", "d3"]),
            shaped(scale(1), &["N", "H", "W", "C"], &["N", "C", "H", "W"]),
            shaped(scale(1), &["N", "3", "H", "W"], &["N", "1", "H", "W"]),
        ];
        let opts = graph_opts(vec![edge(0, "y", 1, "x"), edge(1, "y", 2, "x")], &[("out", 2, "y")]);
        let g = compose(models, &labels(3), &opts).unwrap().model.graph.unwrap();
        assert_eq!(shape_of(&g.input[0]), ["N", "d1", "d2", "3"]);
        assert_eq!(shape_of(&g.output[0]), ["N", "1", "d1", "d2"]);
        // Two different sizes for one class: it stays a name.
        let models = vec![
            shaped(scale(1), &["N", "4"], &["N", "4"]),
            shaped(scale(1), &["N", "d"], &["N", "d"]),
            shaped(scale(1), &["N", "5"], &["N", "5"]),
        ];
        let opts = graph_opts(vec![edge(0, "y", 1, "x"), edge(1, "y", 2, "x")], &[("mid", 1, "y"), ("out", 2, "y")]);
        let g = compose(models, &labels(3), &opts).unwrap().model.graph.unwrap();
        assert_eq!(shape_of(&g.output[0]), ["N", "d"]);
    }

    #[test]
    fn made_up_names_give_way_to_real_ones() {
        // skl2onnx's classifier declares [unk__1, 10]; the softmax after it calls it N.
        let models =
            vec![shaped(scale(1), &["unk__0", "4"], &["unk__1", "10"]), shaped(scale(1), &["N", "d1"], &["N", "d1"])];
        let opts = graph_opts(vec![edge(0, "y", 1, "x")], &[("p", 1, "y")]);
        let g = compose(models, &labels(2), &opts).unwrap().model.graph.unwrap();
        assert_eq!(shape_of(&g.output[0]), ["N", "10"]);
        use crate::merge::plan::adapters::placeholder;
        assert!(placeholder("unk__12") && !placeholder("unk__") && !placeholder("unknown"));
    }

    #[test]
    fn products_of_known_sizes_are_sizes() {
        // flatten declares [N, d1*d2*d3]; fed [batch, 3, 8, 8] it writes [batch, 192], and a
        // factor of unknown size keeps the product, in the names its classes took.
        let flatten = |m| shaped(m, &["N", "d1", "d2", "d3"], &["N", "d1*d2*d3"]);
        let models = vec![shaped(scale(1), &["batch", "3"], &["batch", "3", "8", "8"]), flatten(scale(1))];
        let opts = graph_opts(vec![edge(0, "y", 1, "x")], &[("out", 1, "y")]);
        let g = compose(models, &labels(2), &opts).unwrap().model.graph.unwrap();
        assert_eq!(shape_of(&g.output[0]), ["batch", "192"]);
        let models = vec![shaped(scale(1), &["batch", "3"], &["batch", "3", "H", "W"]), flatten(scale(1))];
        let g = compose(models, &labels(2), &opts).unwrap().model.graph.unwrap();
        assert_eq!(shape_of(&g.output[0]), ["batch", "3*H*W"]);
    }

    #[test]
    fn pruning_leaves_out_what_no_output_needs() {
        let models = vec![distinct(1.0), distinct(2.0), distinct(3.0)];
        let edges = vec![edge(0, "y", 1, "x"), edge(0, "y", 2, "x")];
        let c = compose(models.clone(), &labels(3), &graph_opts(edges.clone(), &[("left", 1, "y")])).unwrap();
        let g = c.model.graph.clone().unwrap();
        assert_eq!(g.node.len(), 4);
        assert_eq!(g.initializer.len(), 2);
        assert_eq!(c.report.pruned.stages, [2]);
        assert_eq!((c.report.pruned.nodes, c.report.pruned.initializers), (2, 1));
        assert_eq!(c.report.unused_outputs, [(2, "y".to_string())]);
        assert_eq!(c.plan.pruned, ["m2.onnx"]);
        assert!(c.plan.stages[2].pruned && !c.plan.stages[1].pruned);
        assert_eq!(c.plan.unused_outputs, [("m2.onnx".to_string(), "y".to_string())]);
        assert_plan_is_the_model(&c);
        assert_eq!(c.origins.nodes, [(0, 2), (2, 4), (4, 4)]);
        // A chain whose tail nothing needs: pruning walks back through it.
        let chain = graph_opts(vec![edge(0, "y", 1, "x"), edge(1, "y", 2, "x")], &[("first", 0, "y")]);
        let c = compose(models.clone(), &labels(3), &chain).unwrap();
        assert_eq!(c.report.pruned.stages, [1, 2]);
        assert_eq!(c.model.graph.unwrap().node.len(), 2);
        // A stage without nodes (its output a weight) that nothing needs is left out too.
        let mut constant = scale(1);
        let g = constant.graph.as_mut().unwrap();
        (g.node, g.input, g.output) = (vec![], vec![], vec![vi("c", 1, &[4])]);
        let only_first = graph_opts(vec![], &[("first", 0, "y")]);
        let c = compose(vec![distinct(1.0), constant], &labels(2), &only_first).unwrap();
        assert_eq!((c.plan.pruned.as_slice(), c.report.pruned.initializers), (&["m1.onnx".to_string()][..], 1));
        assert_plan_is_the_model(&c);
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
        let both = Options { io_maps: Some(vec![Some(vec![])]), edges: Some(vec![]), ..Default::default() };
        assert!(composition_error(vec![scale(1), scale(1)], &both).contains("not both"));
    }
}
