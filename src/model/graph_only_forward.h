// Marks a forward pass that is run only for its autograd graph: activation checkpointing's
// recompute in backward backpropagates through the recomputed layer but never reads its output.
// A part of the layer whose value reaches that output only through a sum may then skip computing
// the value and build just its graph (TiledMLP does: see sp/tiled_mlp.h).
#pragma once

namespace ulysses::model {

// While an object of this class lives, the layer forwards run on this thread are run for their
// graph only: whoever runs them backpropagates through the output and never reads its value, nor
// the value of anything computed from it. Scopes nest. Thread-local, so it covers exactly the
// forward the opening thread runs (autograd runs a node's backward, and with it a checkpointed
// layer's recompute, on one thread). Not copyable.
class GraphOnlyForward {
 public:
  GraphOnlyForward();
  ~GraphOnlyForward();
  GraphOnlyForward(const GraphOnlyForward&) = delete;
  GraphOnlyForward& operator=(const GraphOnlyForward&) = delete;

  // Whether a GraphOnlyForward is open on this thread.
  static bool active();

 private:
  bool was_active_;
};

}  // namespace ulysses::model
