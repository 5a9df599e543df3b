class TritonPythonModel:
    def initialize(self, args):
        raise RuntimeError("fails to load on purpose")

    def execute(self, requests):
        return []
