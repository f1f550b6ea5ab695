"""SCAFFOLD's messages: the control variates travel as the plug-in's arrays.

``train`` with plug-in ``scaffold``: the instruction carries the server control variate c as the
plug-in's arrays (one array per model parameter, shaped like it); the reply carries the trained
weights, the usual ``TrainStats`` and, as the plug-in's arrays, the change of the client's own
control variate, c_i+ - c_i (weight-shaped, like the model it corrects). Nothing else leaves the
client: its control variate c_i stays in its state.
"""

from __future__ import annotations

PLUGIN = "scaffold"
