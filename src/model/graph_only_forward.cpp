// The thread-local graph-only flag (see graph_only_forward.h).
#include "model/graph_only_forward.h"

namespace ulysses::model {
namespace {

thread_local bool graph_only = false;

}  // namespace

GraphOnlyForward::GraphOnlyForward() : was_active_(graph_only) { graph_only = true; }

GraphOnlyForward::~GraphOnlyForward() { graph_only = was_active_; }

bool GraphOnlyForward::active() { return graph_only; }

}  // namespace ulysses::model
