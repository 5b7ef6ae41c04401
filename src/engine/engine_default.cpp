// The default policy set, instantiated once here (eRPC style): users of
// transfer_engine<> link against this instead of compiling the data path.
#include <tide/engine.hpp>

namespace tide {
template class rdma::rdma_transport<default_policies>;
template class transfer_engine<default_policies>;
}  // namespace tide
