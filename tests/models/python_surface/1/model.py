import json
import sys

import numpy as np
import surface_helper  # a sibling module of the version directory
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.args = dict(args)
        self.config = json.loads(args["model_config"])
        try:
            pb_utils.InferenceRequest(
                model_name="python_surface", inputs=[], requested_output_names=[]
            ).exec()
            self.init_bls = ""
        except Exception as exc:  # Triton refuses BLS outside execute
            self.init_bls = str(exc)
        self.init_dir = pb_utils.get_model_dir()
        family = pb_utils.MetricFamily("surface_requests", "Requests seen", pb_utils.MetricFamily.COUNTER)
        self.family = family
        self.counter = family.Metric(labels={"model": "python_surface", "version": "1"})
        self.gauge_family = pb_utils.MetricFamily("surface_last", "Last size", pb_utils.MetricFamily.GAUGE)
        self.gauge = self.gauge_family.Metric(labels={"model": "python_surface"})
        self.hist_family = pb_utils.MetricFamily("surface_size", "Sizes", pb_utils.MetricFamily.HISTOGRAM)
        self.hist = self.hist_family.Metric(labels={"model": "python_surface"}, buckets=[1.0, 4.0])

    def execute(self, requests):
        import model  # Triton's stub registers model.py as module `model`

        out = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "X").as_numpy()
            self.counter.increment(1)
            self.gauge.set(float(x.size))
            self.hist.observe(float(x.size))
            pb_utils.Logger.log_info("surface info")
            pb_utils.Logger.log("surface verbose", pb_utils.Logger.VERBOSE)
            pb_utils.Logger.log_warn("surface warn")
            report = {
                "args": self.args,
                "argv": sys.argv,
                "model_module": model.TritonPythonModel is TritonPythonModel,
                "init_bls": self.init_bls,
                "init_dir": self.init_dir,
                "dir": pb_utils.get_model_dir(),
                "decoupled": pb_utils.using_decoupled_model_transaction_policy(self.config),
                "ready": pb_utils.is_model_ready("python_surface"),
                "ready_missing": pb_utils.is_model_ready("no_such_model"),
                "parameters": json.loads(request.parameters()),
                "request_id": request.request_id(),
                "counter": self.counter.value(),
                "dtype": request.inputs()[0].triton_dtype(),
            }
            out.append(
                pb_utils.InferenceResponse(
                    output_tensors=[
                        pb_utils.Tensor("REPORT", np.array([json.dumps(report).encode()], dtype=object)),
                        pb_utils.Tensor("Y", surface_helper.double(x)),
                    ]
                )
            )
        return out
