"""streamplan's ComfyUI node pack: the nodes live in the installed package (streamplan.comfy_nodes).

Install: `pip install <this repository>` into ComfyUI's Python, then put this folder into
ComfyUI/custom_nodes (a copy or a link). See README.md here.
"""

from streamplan.comfy_nodes import NODE_CLASS_MAPPINGS, NODE_DISPLAY_NAME_MAPPINGS

__all__ = ["NODE_CLASS_MAPPINGS", "NODE_DISPLAY_NAME_MAPPINGS"]
