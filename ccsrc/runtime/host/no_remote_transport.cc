// A build without UCX: the host device has no transport to other nodes, and says how to get one.
#include "runtime/host/remote_transport.h"

namespace hp::shmem::host {

Result<std::unique_ptr<RemoteTransport>> OpenRemoteTransport(const RemoteTransportArgs& /*args*/,
                                                             std::string* absence) {
  *absence = "this build of hyper-parallel-shmem has no UCX; install it with `pip install hyper-parallel-shmem[ucx]` "
             "(or a system UCX) and build the package again";
  return std::unique_ptr<RemoteTransport>();
}

}  // namespace hp::shmem::host
