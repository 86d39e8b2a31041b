"""Imported once by the executors' fork server (multiprocessing's forkserver, preloaded with this
module): every executor, and every restart after a crash, forks from a process that already
holds torch, transformers, nnsight and metaload, so it only builds its model (seconds of imports
saved per start)."""
import metaload  # noqa: F401
import nnsight  # noqa: F401
import torch  # noqa: F401
import torch._dynamo  # noqa: F401 (nnsight's meta build imports it first)
import transformers  # noqa: F401
import transformers.image_processing_utils  # noqa: F401 (the pipeline's preprocessors)
import transformers.modeling_utils  # noqa: F401
import transformers.pipelines  # noqa: F401
from nnsight.modeling import language, transformers as nn_transformers  # noqa: F401
from nnsight.schema import request, response  # noqa: F401

from . import executor  # noqa: F401
