#include "runtime/agreement.h"

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

namespace hp::shmem {

Status AgreeOnStatus(Bootstrap& bootstrap, const Status& local, const char* step) {
  struct Wire {
    std::int32_t code;
    char message[476];   // with the code, 480 bytes per rank; longer messages are cut
  };
  Wire mine{};
  mine.code = static_cast<std::int32_t>(local.code());
  std::strncpy(mine.message, local.message().c_str(), sizeof(mine.message) - 1);
  std::vector<Wire> all(static_cast<std::size_t>(bootstrap.world_size()));
  HP_RETURN_IF_ERROR(bootstrap.AllGather(&mine, sizeof(Wire), all.data()));
  for (std::size_t r = 0; r < all.size(); ++r) {
    if (all[r].code == 0) continue;
    all[r].message[sizeof(all[r].message) - 1] = '\0';
    return Status(static_cast<StatusCode>(all[r].code),
                  std::string(step) + " failed: rank=" + std::to_string(r) + " (" + all[r].message + ")");
  }
  return Status::Ok();
}

}  // namespace hp::shmem
