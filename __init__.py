"""ComfyUI loads this file when the repository is cloned into ComfyUI/custom_nodes: the node
pack of comfyui/ (streamplan's package must be installed into ComfyUI's Python first; see
comfyui/README.md). Nothing else imports it."""

try:
    from .comfyui import NODE_CLASS_MAPPINGS, NODE_DISPLAY_NAME_MAPPINGS
except ImportError as e:  # the package is not installed: say how, and load no nodes
    import logging
    import os

    logging.error("streamplan's ComfyUI nodes need the streamplan package in this Python (%s): "
                  "pip install --no-build-isolation %s", e, os.path.dirname(os.path.abspath(__file__)))
    NODE_CLASS_MAPPINGS, NODE_DISPLAY_NAME_MAPPINGS = {}, {}

__all__ = ["NODE_CLASS_MAPPINGS", "NODE_DISPLAY_NAME_MAPPINGS"]
